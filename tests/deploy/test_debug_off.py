"""With ``DEBUG`` off, as an operator runs it: the admin's login page and its static files
answer 200 from gunicorn itself (WhiteNoise over ``collectstatic``'s output), and the
secure-cookie rule of docs/OPERATIONS.md holds over plain http."""

from __future__ import annotations

import re

import pytest
import requests

from tests.deploy.servers import collectstatic, gunicorn, production_variables
from tests.factories import PlatformAdminFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PASSWORD = "a-long-operator-password"


@pytest.fixture
def collected(settings, tmp_path):
    """``collectstatic`` with DEBUG off, into a STATIC_ROOT of the test's own."""
    variables = production_variables(STATIC_ROOT=str(tmp_path / "static"))
    collectstatic(settings, **variables)
    return variables


def test_the_admin_login_and_its_static_files_answer_200_without_debug(
    settings, tmp_path, collected
):
    with gunicorn(settings, tmp_path, **collected) as server:
        login = requests.get(f"{server.url}/admin/login/", timeout=10)
        assert login.status_code == 200, server.text()
        stylesheets = re.findall(r'href="(/static/[^"]+\.css)"', login.text)
        assert stylesheets, login.text
        for path in stylesheets:
            # The hashed name the manifest gives: cached for ever, as WhiteNoise serves it.
            assert re.search(r"\.[0-9a-f]{12}\.css$", path), path
            static = requests.get(f"{server.url}{path}", timeout=10)
            assert static.status_code == 200, path
            assert static.headers["Content-Type"].startswith("text/css")
            assert "max-age=315360000" in static.headers["Cache-Control"]
        docs = requests.get(f"{server.url}/api/docs/", timeout=10)
        assert docs.status_code == 200
        for path in re.findall(r'src="(/static/[^"]+\.js)"', docs.text):
            assert requests.get(f"{server.url}{path}", timeout=10).status_code == 200, path


def log_in(url: str) -> requests.Response:
    session = requests.Session()
    page = session.get(f"{url}/admin/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return session.post(
        f"{url}/admin/login/?next=/admin/",
        data={"csrfmiddlewaretoken": token, "username": "ops@example.com", "password": PASSWORD},
        headers={"Referer": f"{url}/admin/login/"},
        timeout=10,
        allow_redirects=False,
    )


def test_over_plain_http_the_admin_login_needs_the_cookies_not_secure(
    settings, tmp_path, collected
):
    # A hash the server's own settings read (the suite's fast MD5 is not among them).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    PlatformAdminFactory(email="ops@example.com", password=PASSWORD)
    # The default without DEBUG: the cookies are HTTPS-only, a client over plain http does
    # not send them back, and the login is CSRF's 403.
    with gunicorn(settings, tmp_path, **collected) as server:
        refused = log_in(server.url)
        assert refused.status_code == 403, server.text()
        assert "CSRF" in refused.text
    with gunicorn(
        settings, tmp_path, **collected, SESSION_COOKIE_SECURE="false", CSRF_COOKIE_SECURE="false"
    ) as server:
        logged_in = log_in(server.url)
        assert logged_in.status_code == 302, logged_in.text
        assert logged_in.headers["Location"] == "/admin/"
