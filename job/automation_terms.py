"""The automations' terms new jobs are checked against, kept by each process.

A job is checked against its automation's terms (active, its parameter schema) before its
transaction, and written with ``automation.selectors.automation_id_on_terms``: its INSERT
finds the automation only while it still has the terms the job was checked against, and
fails otherwise (the job's automation column refuses the NULL it gets). So the terms read
by an earlier request serve the next ones without a read of their own: a change to the
automation (deactivated, a new schema) is found by the first write after it, which reads
the terms again (``fresh``) and checks the job again. Nothing is accepted on old terms, and
every refusal is decided on terms read for it (``job.services``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from automation.selectors import JobTerms, automation_job_terms

# Automations whose terms a process keeps (the least recently used go first): each is a
# few hundred bytes, and its schema (at most 64 KiB).
CACHED_AUTOMATIONS = 256

_terms: OrderedDict[int, JobTerms] = OrderedDict()
_lock = threading.Lock()


def cached(automation_id: int) -> JobTerms | None:
    """The terms this process read last for the automation, or None when it has none."""
    with _lock:
        terms = _terms.get(automation_id)
        if terms is not None:
            _terms.move_to_end(automation_id)
        return terms


def fresh(automation_id: int) -> JobTerms | None:
    """The automation's terms read now (None: there is no such automation), kept for the
    next requests."""
    terms = automation_job_terms(automation_id)
    with _lock:
        if terms is None:
            _terms.pop(automation_id, None)
        else:
            _terms[automation_id] = terms
            _terms.move_to_end(automation_id)
            while len(_terms) > CACHED_AUTOMATIONS:
                _terms.popitem(last=False)
    return terms


def forget_all() -> None:
    """Keep no terms (tests)."""
    with _lock:
        _terms.clear()
