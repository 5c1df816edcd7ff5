"""Settings of the processes a reliability scenario starts: the project's, plus this folder
as an app (its ``tasks.py`` handler is discovered by ``run_worker``) and the scenarios'
task catalog."""

import os

from hubdommed.settings import *  # noqa: F403
from hubdommed.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.reliability"]
TASKS_CATALOG = os.environ["TASKS_CATALOG"]
