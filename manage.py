#!/usr/bin/env python
"""Django's command-line utility for Hub DomMed."""

import os
import sys


def main() -> None:
    # Before anything slow: a daemon told to stop while it starts exits 0 (lifecycle.startup).
    from lifecycle.startup import catch_stop_during_startup

    catch_stop_during_startup(sys.argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
    # A bad variable: one line naming it, before any command starts.
    from common.env import settings_or_exit

    settings_or_exit()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
