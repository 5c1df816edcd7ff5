from django.apps import AppConfig


class WorkerTestsConfig(AppConfig):
    """This folder as an app, for its ``tasks.py``; its label differs from the ``worker``
    app's."""

    name = "tests.worker"
    label = "worker_tests"
