"""Settings for a worker run as a subprocess by the tests: the project's, plus this
folder as an app (so its ``tasks.py`` handlers are discovered) and a test catalog."""

import os

from hubdommed.settings import *  # noqa: F403
from hubdommed.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.worker.apps.WorkerTestsConfig"]
TASKS_CATALOG = os.environ["TASKS_CATALOG"]
