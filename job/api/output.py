"""``/jobs/{id}/output``: the worker sends its command's output (POST), people read it (GET).

One path, two callers: each method keeps the authentication, permission and formats of
its side (``JobOutputAppendApi``, ``JobOutputReadApi``).
"""

from __future__ import annotations

from job.api.people import JobOutputReadApi
from job.api.workers import JobOutputAppendApi


class JobOutputApi(JobOutputAppendApi, JobOutputReadApi):
    _method = "GET"

    def initialize_request(self, request, *args, **kwargs):
        # The first to need the side, with the request (the schema's generator's too).
        self._method = request.method
        return super().initialize_request(request, *args, **kwargs)

    def _side(self):
        return JobOutputAppendApi if self._method == "POST" else JobOutputReadApi

    def get_authenticators(self):
        return [authentication() for authentication in self._side().authentication_classes]

    def get_permissions(self):
        return [permission() for permission in self._side().permission_classes]

    def get_renderers(self):
        return [renderer() for renderer in self._side().renderer_classes]
