"""An active sector's name is unique whatever its case, and the pre-check says exactly
what the database's unique index ``sectors_active_name_key`` enforces.

PostgreSQL's ``UPPER`` and ``LOWER`` disagree on some letters (the final and the medial
sigma, the dotless i, the long s, the Kelvin sign…): a pre-check that compared with one
while the index compared with the other let two racing creations both through, and then
refused every later change of either row. Both now compare the same key.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from sector import admin as sector_admin
from sector import services as sector_services
from sector.models import Sector
from sector.selectors import sector_name_in_use
from tests.clients import client_of
from tests.factories import PlatformAdminFactory, SectorFactory
from tests.locks import all_past, sent_together

pytestmark = pytest.mark.django_db

# Pairs that are one name whatever the case, however PostgreSQL folds it.
SAME_NAME = [
    ("ΟΔΟΣ x", "οδος x"),  # capital sigma, final sigma
    ("οδος x", "ΟΔΟΣ x"),
    ("οδος x", "\u03bf\u03b4\u03bf\u03c3 x"),  # final sigma, sigma
    ("ΟΔΟΣ x", "\u03bf\u03b4\u03bf\u03c3 x"),
    ("Bak\u0131r", "BAKIR"),  # dotless i
    ("BAKIR", "bak\u0131r"),
    ("bak\u0131r", "bakir"),
    ("İstanbul", "istanbul"),  # dotted capital I
    ("istanbul", "İstanbul"),
    ("Finance", "FINANCE"),
    ("Cla\u017fs", "class"),  # long s
    ("\u212aelvin", "kelvin"),  # Kelvin sign
    ("\u00b5-lab", "\u03bc-lab"),  # micro sign, mu
]
# Pairs that are two names.
DIFFERENT_NAMES = [("Finance", "Finances"), ("stra\u00dfe", "strasse"), ("Ódos", "Odos")]


def _index_refuses(name: str) -> bool:
    """Whether the unique index refuses one more active sector named ``name``."""
    try:
        with transaction.atomic():
            Sector.objects.create(name=name, slug=f"probe-{Sector.objects.count()}")
    except IntegrityError:
        return True
    return False


@pytest.mark.parametrize(("first", "second"), SAME_NAME + DIFFERENT_NAMES)
def test_the_pre_check_and_the_index_agree(first, second):
    SectorFactory(name=first)

    in_use = sector_name_in_use(second)

    assert in_use == _index_refuses(second)
    assert in_use == ((first, second) in SAME_NAME)


@pytest.mark.parametrize(("first", "second"), SAME_NAME)
def test_one_name_in_another_case_is_a_409_whichever_comes_first(first, second):
    admin = client_of(PlatformAdminFactory())
    created = admin.post("/api/v1/sectors", {"name": first, "slug": "one"}, format="json")
    assert created.status_code == 201, created.content

    response = admin.post("/api/v1/sectors", {"name": second, "slug": "two"}, format="json")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "sector_name_taken"
    assert Sector.objects.count() == 1


@pytest.mark.parametrize(("first", "second"), SAME_NAME[:5])
def test_renaming_into_another_case_of_a_taken_name_is_a_409(first, second):
    admin = client_of(PlatformAdminFactory())
    SectorFactory(name=first)
    other = SectorFactory(name="Other")

    response = admin.patch(f"/api/v1/sectors/{other.id}", {"name": second}, format="json")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "sector_name_taken"


def test_a_sector_may_be_renamed_to_its_own_name_in_another_case():
    admin = client_of(PlatformAdminFactory())
    sector = SectorFactory(name="οδος x")

    response = admin.patch(f"/api/v1/sectors/{sector.id}", {"name": "ΟΔΟΣ x"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["name"] == "ΟΔΟΣ x"


def test_a_change_that_keeps_the_name_is_never_refused_over_the_name(monkeypatch):
    # Whatever the name check would say, a change that does not touch the name is not
    # refused because of it (the row's own name, or rows written before the check agreed
    # with the index, must never lock a sector out of its edits).
    admin = client_of(PlatformAdminFactory())
    sector = SectorFactory(name="ΟΔΟΣ x")
    monkeypatch.setattr(sector_services, "sector_name_in_use", _taken)

    response = admin.patch(
        f"/api/v1/sectors/{sector.id}", {"description": "Roads", "name": "ΟΔΟΣ x"}, format="json"
    )

    assert response.status_code == 200, response.content
    assert Sector.objects.get(pk=sector.pk).description == "Roads"


def test_the_admin_never_refuses_a_change_over_the_sectors_own_name(monkeypatch, admin_site):
    sector = SectorFactory(name="ΟΔΟΣ x")
    monkeypatch.setattr(sector_admin, "sector_name_in_use", _taken)
    monkeypatch.setattr(sector_services, "sector_name_in_use", _taken)

    response = admin_site.post(
        f"/admin/sector/sector/{sector.id}/change/",
        {"name": "ΟΔΟΣ x", "slug": sector.slug, "description": "Roads"},
    )

    assert response.status_code == 302, response.context["adminform"].errors
    assert Sector.objects.get(pk=sector.pk).description == "Roads"


def test_the_admin_refuses_another_case_of_a_taken_name(admin_site):
    SectorFactory(name="ΟΔΟΣ x")

    response = admin_site.post(
        "/admin/sector/sector/add/", {"name": "οδος x", "slug": "two", "description": ""}
    )

    assert response.status_code == 200
    assert "name" in response.context["adminform"].form.errors
    assert Sector.objects.count() == 1


def test_a_description_change_runs_no_uniqueness_query():
    admin = client_of(PlatformAdminFactory())
    sector = SectorFactory(name="ΟΔΟΣ x")

    with CaptureQueriesContext(connection) as queries:
        response = admin.patch(
            f"/api/v1/sectors/{sector.id}", {"description": "Roads"}, format="json"
        )

    assert response.status_code == 200, response.content
    lookups = [
        q["sql"] for q in queries if q["sql"].startswith("SELECT 1 AS") and '"sectors"' in q["sql"]
    ]
    assert lookups == []


def _taken(*_args, **_kwargs) -> bool:
    return True


# --- Races --------------------------------------------------------------------------------


def _race(requests, *, past_the_check: bool = False, monkeypatch=None):
    """Send ``requests`` (callables taking a client) at once: the answers (status, body).

    With ``past_the_check``, every request passes the name check before any of them
    writes: the race the index alone has to decide, every time.
    """
    if past_the_check:
        all_past(monkeypatch, sector_services, "sector_name_in_use", len(requests))
    return sent_together(PlatformAdminFactory(), requests)


def _create(name: str, slug: str):
    return lambda client: client.post(
        "/api/v1/sectors", {"name": name, "slug": slug}, format="json"
    )


def _outcome(answers) -> list:
    return sorted(
        (status, body.get("error", {}).get("code")) if status >= 400 else (status, None)
        for status, body in answers
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("first", "second"), [("ΟΔΟΣ x", "οδος x"), ("Bak\u0131r", "bakir")])
def test_two_creations_racing_past_the_check_give_one_201_and_one_409(monkeypatch, first, second):
    answers = _race(
        [_create(first, "one"), _create(second, "two")],
        past_the_check=True,
        monkeypatch=monkeypatch,
    )

    assert _outcome(answers) == [(201, None), (409, "sector_name_taken")], answers
    assert Sector.objects.filter(is_active=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_creations_racing_freely_never_leave_two_sectors_of_one_name():
    for round_ in range(5):
        answers = _race([_create("ΟΔΟΣ x", f"a{round_}"), _create("οδος x", f"b{round_}")])

        assert _outcome(answers) == [(201, None), (409, "sector_name_taken")], answers
        assert Sector.objects.filter(is_active=True).count() == 1
        Sector.objects.all().delete()


@pytest.mark.django_db(transaction=True)
def test_two_renames_racing_past_the_check_give_one_200_and_one_409(monkeypatch):
    one = SectorFactory(name="One")
    two = SectorFactory(name="Two")

    answers = _race(
        [
            lambda client: client.patch(
                f"/api/v1/sectors/{one.id}", {"name": "ΟΔΟΣ x"}, format="json"
            ),
            lambda client: client.patch(
                f"/api/v1/sectors/{two.id}", {"name": "οδος x"}, format="json"
            ),
        ],
        past_the_check=True,
        monkeypatch=monkeypatch,
    )

    assert _outcome(answers) == [(200, None), (409, "sector_name_taken")], answers
    assert sorted(Sector.objects.values_list("name", flat=True)) != ["ΟΔΟΣ x", "οδος x"]
