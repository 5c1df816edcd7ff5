"""docs/OPERATIONS.md keeps up with the settings and the metrics: every variable the
settings read is documented, and the example alert rules parse and name real metrics."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "OPERATIONS.md").read_text()
METRIC = re.compile(r"\bhubdommed_[a-z0-9_]+")
# Suffixes Prometheus adds to a histogram's series.
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def settings_variables() -> set[str]:
    source = (ROOT / "hubdommed" / "settings.py").read_text()
    read = re.findall(r"\benv\.\w+\(\s*\"([A-Z][A-Z0-9_]*)\"", source)
    read += re.findall(r"_login_rate\(\s*\"([A-Z][A-Z0-9_]*)\"", source)
    return set(read)


def documented_metrics() -> set[str]:
    table = DOC.split("## Metrics", 1)[1].split("```yaml", 1)[0]
    return set(METRIC.findall(table))


def test_every_variable_the_settings_read_is_documented():
    variables = settings_variables()
    assert len(variables) > 50  # the pattern finds them
    missing = sorted(name for name in variables if f"`{name}`" not in DOC)
    assert not missing, missing


# The apps' metrics modules (each declares its series at import).
METRICS_MODULES = [
    *sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in ROOT.glob("*/metrics.py")
        if (path.parent / "__init__.py").exists()
    ),
    "job.monitor_metrics",
]


def exposed_metrics() -> set[str]:
    """The series the hub declares, read from prometheus-client's registry itself."""
    from prometheus_client import REGISTRY

    from outbox.metrics import OutboxBacklogCollector

    for module in METRICS_MODULES:
        importlib.import_module(module)
    collectors = {*REGISTRY._names_to_collectors.values(), OutboxBacklogCollector()}
    names = set()
    for collector in collectors:
        for family in getattr(collector, "describe", list)():
            if family.name.startswith("hubdommed_"):
                suffix = "_total" if family.type == "counter" else ""
                names.add(family.name + suffix)
    return names


EXPOSED = exposed_metrics()


def test_each_metric_is_documented():
    assert documented_metrics() == EXPOSED


def test_the_example_alert_rules_parse_and_name_only_documented_metrics():
    (block,) = re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)
    rules = yaml.safe_load(block)
    known = EXPOSED
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert len(alerts) >= 8
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
    for rule in alerts:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", rule["alert"])
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["for"]
        named = {HISTOGRAM_SERIES.sub("", name) for name in METRIC.findall(rule["expr"])}
        assert named, rule["expr"]
        assert named <= known, named - known


def variables_table() -> list[str]:
    table = DOC.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", table, flags=re.MULTILINE)


def test_no_variable_is_listed_twice():
    listed = variables_table()
    assert len(listed) > 50
    assert sorted({name for name in listed if listed.count(name) > 1}) == []
    # Nor again among the variables that are not settings.
    others = DOC.split("Not settings, but read by the processes:", 1)[1].split("\n\n", 1)[0]
    assert [name for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", others) if name in listed] == []


def test_the_roles_name_every_daemon_of_the_procfile():
    roles = DOC.split("## Deploying", 1)[0]
    for line in (ROOT / "Procfile").read_text().splitlines():
        if "manage.py" in line and not line.startswith("#"):
            command = line.split("manage.py", 1)[1].split()[0]
            assert f"manage.py {command}" in roles, command


def test_the_compose_section_states_the_compose_version_it_needs_and_the_first_admin():
    compose = DOC.split("### With compose", 1)[1].split("\n### ", 1)[0]
    assert "Docker Compose 2.24 or later" in compose
    assert "createsuperuser" in compose
    assert "Docker Compose 2.24 or later" in (ROOT / "compose.yaml").read_text()
