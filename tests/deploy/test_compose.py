"""compose.yaml, the image and the production settings, as a new user would run them."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "scripts" / "healthcheck.py"
DAEMONS = {"relay", "worker", "monitor", "scheduler"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def environment(compose: dict, service: str) -> dict[str, str]:
    return {k: str(v) for k, v in compose["services"][service]["environment"].items()}


def test_the_api_answers_to_the_name_the_workers_reach_it_by(compose):
    for service in ("api", *DAEMONS):
        env = environment(compose, service)
        hub = urlparse(env["HUB_URL"])
        assert hub.hostname == "api", env["HUB_URL"]
        assert hub.hostname in env["ALLOWED_HOSTS"].split(","), env["ALLOWED_HOSTS"]
        # And the port it names is the one the API listens on inside the network.
        assert hub.port == 8000
    assert compose["services"]["api"]["ports"] == ["${PORT:-8000}:8000"]


def test_every_long_running_service_has_a_health_check_of_its_own(compose):
    test = compose["services"]["api"]["healthcheck"]["test"]
    (url,) = [part for part in test if "/health/ready" in part]
    # Probed by a name the API answers to, whatever ALLOWED_HOSTS the user adds.
    assert urlparse(url).hostname in environment(compose, "api")["ALLOWED_HOSTS"].split(",")[:1]
    for daemon in DAEMONS:
        service = compose["services"][daemon]
        check = " ".join(service["healthcheck"]["test"])
        liveness = environment(compose, daemon)["LIVENESS_FILE"]
        # Its own sign of life, never an HTTP probe of a server it does not run.
        assert f"--liveness {liveness}" in check, check
        assert "/health/" not in check
        assert environment(compose, daemon)["METRICS_PORT"] != "0"
    # Exactly one relay.
    relays = [
        name
        for name, service in compose["services"].items()
        if str(service.get("environment", {}).get("HUBDOMMED_RELAY", "false")).lower() == "true"
    ]
    assert relays == ["relay"]


def test_the_image_health_check_probes_http_only_where_no_liveness_file_is_set():
    dockerfile = (ROOT / "Dockerfile").read_text()
    (line,) = [line for line in dockerfile.splitlines() if "CMD [" in line and "health" in line]
    assert "scripts/healthcheck.py" in line
    assert "urlopen" not in dockerfile


def run_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_liveness_check_follows_the_file_age(tmp_path):
    alive = tmp_path / "relay.alive"
    assert run_check("--liveness", str(alive), "--max-age", "60").returncode == 1
    alive.touch()
    assert run_check("--liveness", str(alive), "--max-age", "60").returncode == 0
    stale = time.time() - 120
    os.utime(alive, (stale, stale))
    result = run_check("--liveness", str(alive), "--max-age", "60")
    assert result.returncode == 1
    assert "more than 60 s" in result.stderr
    # Chosen by the environment in the image's own HEALTHCHECK.
    assert run_check(env={"LIVENESS_FILE": str(alive), "LIVENESS_MAX_AGE": "300"}).returncode == 0


@pytest.mark.django_db
def test_the_readiness_check_asks_the_api(live_server):
    assert run_check("--ready", f"{live_server.url}/health/ready").returncode == 0
    assert run_check("--ready", f"{live_server.url}/health/nothing").returncode == 1


def production_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SECURE_"))}
    env.update(
        DEBUG="false",
        SECRET_KEY=secrets.token_urlsafe(50),
        WEBHOOK_SECRET_KEYS=base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        ALLOWED_HOSTS="hub.example.com,api",
        CSRF_TRUSTED_ORIGINS="https://hub.example.com",
        TRUST_X_FORWARDED_PROTO="true",
        DJANGO_SETTINGS_MODULE="hubdommed.settings",
    )
    return env


def test_check_deploy_reports_nothing_with_production_values():
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "DEBUG"],
        cwd=ROOT,
        env=production_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", (
        result.stdout + result.stderr
    )
