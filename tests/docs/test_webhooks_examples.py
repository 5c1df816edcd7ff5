"""The examples of docs/webhooks.md work as written: the shell calls against the real API,
in bash and zsh, and both ways of verifying a delivery against the hub's own signatures."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from standardwebhooks import WebhookVerificationError

from tests.docs.test_readme import section, shell_script, walkthrough
from tests.schedule.test_readme import json_values
from webhook.models import WebhookEndpoint
from webhook.signing import new_message_id, new_secret, signed_headers

PAGE = "docs/webhooks.md"


def code_blocks(text: str) -> list[str]:
    """The indented code blocks of a text, one string each, without their indentation."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("    ") or (current and not line.strip()):
            current.append(line[4:])
        elif current:
            blocks.append("\n".join(current).strip("\n"))
            current = []
    if current:
        blocks.append("\n".join(current).strip("\n"))
    return blocks


def python_example(first_line: str) -> dict:
    """Run the code block of the delivery section that starts with ``first_line``."""
    [code] = [
        block
        for block in code_blocks(section(PAGE, "## A delivery and its signature"))
        if block.startswith(first_line)
    ]
    namespace: dict = {}
    exec(compile(code, f"<example in {PAGE}>", "exec"), namespace)  # noqa: S102 (the page's own example)
    return namespace


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_endpoint_examples_run_as_written(shell, live_server, settings, tmp_path):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    login = tmp_path / "demo-login.txt"
    settings.DEMO_LOGIN_FILE = str(login)
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    script = (walkthrough() + "\n" + shell_script(PAGE, "## Endpoints")).replace(
        "var/demo-login.txt", str(login)
    )
    script = script.replace("http://127.0.0.1:8000", live_server.url)

    done = subprocess.run(
        [shell, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )

    assert done.returncode == 0, done.stderr
    *_, created, rotated, deliveries = json_values(done.stdout)
    endpoint = WebhookEndpoint.objects.get()
    assert created["id"] == rotated["id"] == endpoint.pk
    assert created["secret"].startswith("whsec_") and rotated["secret"].startswith("whsec_")
    assert rotated["secret"] != created["secret"]
    assert endpoint.url == "https://hooks.example.com/hub"
    assert endpoint.event_types == ["JobCompleted", "JobFailed"]
    assert deliveries["results"] == []


def a_delivery(*secrets: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {"type": "JobCompleted", "timestamp": datetime.now(UTC).isoformat(), "data": {"job_id": 42}}
    )
    headers = signed_headers(
        message_id=new_message_id(), body=body, secrets_in_use=list(secrets), at=datetime.now(UTC)
    )
    return body.encode(), headers


def test_verifying_by_hand_accepts_the_hubs_signatures_and_nothing_else():
    verify = python_example("import base64")["verify"]
    secret, old_secret, stranger = new_secret(), new_secret(), new_secret()

    body, headers = a_delivery(secret, old_secret)  # during a rotation: two signatures

    assert verify(body, headers, secret) and verify(body, headers, old_secret)
    assert not verify(body, headers, stranger)
    assert not verify(body + b" ", headers, secret)


def test_verifying_with_standardwebhooks_accepts_the_hubs_signature_and_nothing_else():
    handle = python_example("from standardwebhooks import Webhook")["handle"]
    secret = new_secret()
    body, headers = a_delivery(secret)

    assert handle(body, headers, secret) == ("JobCompleted", {"job_id": 42})
    with pytest.raises(WebhookVerificationError):
        handle(body, headers, new_secret())
