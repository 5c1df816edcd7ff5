"""An offset no log can reach is refused on both ways of reading a job's log, as the
stream refuses it: an answer that echoes it back (``offset``, ``next_offset``) would carry
a number past the log's bigint offsets, which many clients cannot even hold (JavaScript's
numbers lose its digits past 2**53)."""

from __future__ import annotations

import pytest

from tests.job.test_output import read, running  # noqa: F401 (a fixture)
from tests.job.test_output_follow import get

pytestmark = pytest.mark.django_db

PAST_ANY_LOG = [str(2**62 + 1), str(2**63), "9" * 500]


@pytest.mark.parametrize("offset", PAST_ANY_LOG)
def test_a_page_from_an_offset_past_any_log_is_a_400(person_client, running, offset):  # noqa: F811
    response = read(person_client, running, offset=offset)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert "offset" in response.json()["error"]["details"]


@pytest.mark.parametrize("offset", PAST_ANY_LOG)
def test_the_page_and_the_stream_refuse_the_same_offsets(person_client, running, offset):  # noqa: F811
    page = read(person_client, running, offset=offset)
    stream, _ = get(person_client, running, QUERY_STRING=f"offset={offset}")

    assert (page.status_code, stream.status_code) == (400, 400)


def test_the_largest_offset_the_stream_takes_reads_an_empty_page(person_client, running):  # noqa: F811
    response = read(person_client, running, offset=2**62)

    assert response.status_code == 200
    assert response.json()["text"] == ""
