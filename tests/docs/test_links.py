"""Every relative link of the README and of docs/ leads somewhere.

The pages link into each other (the README's walkthrough, a section of OPERATIONS.md) and
to files of the repository. Text moves between pages; a link that still points where the
text used to be is found here, down to the heading its ``#anchor`` names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.test_readme import PAGES, ROOT, page_id

# [text](target): the target up to a space or the closing parenthesis.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    # Headings inside indented code blocks are not headings.
    text = "\n".join(line for line in page.read_text().splitlines() if not line.startswith("    "))
    return {anchor(heading) for heading in HEADING.findall(text)}


def test_an_anchor_is_the_one_github_makes():
    assert anchor("Try it: a job from request to result") == "try-it-a-job-from-request-to-result"
    assert anchor("The operators' console (`/admin/`)") == "the-operators-console-admin"
    assert anchor("How we know: the tests") == "how-we-know-the-tests"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_leads_to_a_file_and_heading(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not ours to check
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        found = linked.exists() and ROOT in linked.parents
        if found and fragment and linked.suffix == ".md":
            found = fragment in anchors(linked)
        if not found:
            broken.append(target)
    assert broken == []
