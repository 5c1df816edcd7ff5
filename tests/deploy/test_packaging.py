"""compose.yaml, the Dockerfile and the Procfile, checked without a container engine."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands
from django.urls import resolve

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def manage_commands_in(command) -> list[str]:
    """The manage.py commands a compose command or Procfile line runs (``sh -c`` included)."""
    parts = command if isinstance(command, list) else [command]
    words = [word for part in parts for word in shlex.split(part)]
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == "manage.py"]


def test_compose_declares_the_services_and_their_dependencies(compose):
    services = compose["services"]
    assert {"postgres", "redis", "rabbitmq", "migrate", "api"} <= set(services)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"


def test_compose_runs_only_commands_that_exist(compose):
    known = set(get_commands())
    for name, service in compose["services"].items():
        for command in manage_commands_in(service.get("command", [])):
            assert command in known, f"service {name} runs unknown command {command}"


def test_compose_runs_the_daemons_and_exactly_one_relay(compose):
    services = compose["services"]
    commands = {
        name: manage_commands_in(service.get("command", [])) for name, service in services.items()
    }
    assert "run_relay" in commands["relay"]
    assert "run_worker" in commands["worker"]
    assert "watch_stuck_jobs" in commands["monitor"]
    relays = [
        name
        for name, service in services.items()
        if str(service.get("environment", {}).get("HUBDOMMED_RELAY", "")).lower() == "true"
    ]
    assert relays == ["relay"]


def test_compose_sets_only_variables_the_settings_read(compose):
    settings_source = (ROOT / "hubdommed" / "settings.py").read_text()
    for name, service in compose["services"].items():
        if service.get("build") is None:
            continue
        for variable in service.get("environment", {}):
            assert f'"{variable}"' in settings_source, f"{name} sets unused {variable}"


def test_the_dockerfile_copies_existing_files_and_serves_the_wsgi_app():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (\S+) ", dockerfile, flags=re.MULTILINE):
        assert source == "." or (ROOT / source).exists(), f"COPY of missing {source}"
    assert "hubdommed.wsgi:application" in dockerfile
    # The health check is a script of the image; the API path it probes exists.
    (script,) = re.findall(r"HEALTHCHECK .*?CMD \[\"python\", \"(\S+)\"\]", dockerfile, re.DOTALL)
    probes = re.findall(r"/health/\w+", (ROOT / script).read_text())
    assert probes and all(resolve(path) for path in probes)


def test_the_procfile_runs_the_api_and_existing_daemons():
    known = set(get_commands())
    for line in (ROOT / "Procfile").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, command = line.split(":", 1)
        for manage_command in manage_commands_in(command):
            assert manage_command in known, f"Procfile {name} runs unknown {manage_command}"
    assert "hubdommed.wsgi:application" in (ROOT / "Procfile").read_text()
