"""WhiteNoise with its table of files read once per process.

Django builds its middleware once per request handler. A server builds one handler per
process, but the test client builds one per client, and WhiteNoise reads every static file's
headers (size, type, compressed variants) each time it is built: hundreds of files per client,
most of a small API test's time. The table is kept per process, keyed by the options that
shape the headers and, for a folder, by the path, size and modification time of every file in
it, so a folder written again (``collectstatic``) is read again and nothing stale is served.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from django.conf import settings
from whitenoise.middleware import WhiteNoiseMiddleware
from whitenoise.string_utils import ensure_leading_trailing_slash

_tables: dict[tuple, dict] = {}
_lock = threading.Lock()


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    def add_files(self, root, prefix=None):
        if self.autorefresh or not os.path.isdir(root):
            return super().add_files(root, prefix=prefix)
        key = ("folder", os.path.abspath(root), ensure_leading_trailing_slash(prefix))
        self._add_once(
            key + _contents(root),
            lambda: super(StaticFilesMiddleware, self).add_files(root, prefix=prefix),
        )

    def add_files_from_finders(self):
        # The apps' static folders, which do not change while a process serves them.
        self._add_once(("finders",), super().add_files_from_finders)

    def _add_once(self, key: tuple, add: Callable[[], None]) -> None:
        key = key + self._header_options()
        with _lock:
            table = _tables.get(key)
            if table is None:
                kept, self.files = self.files, {}
                try:
                    add()
                    table = _tables[key] = self.files
                finally:
                    self.files = kept
        self.files.update(table)

    def _header_options(self) -> tuple:
        return (
            type(self),
            self.max_age,
            self.allow_all_origins,
            self.charset,
            self.index_file,
            self.add_headers_function,
            self.static_prefix,
            repr(getattr(settings, "WHITENOISE_MIMETYPES", None)),
            repr(getattr(settings, "WHITENOISE_IMMUTABLE_FILE_TEST", None)),
            settings.STORAGES["staticfiles"]["BACKEND"],
        )


def _contents(root: str) -> tuple:
    """Every file under ``root`` with its size and modification time, in a stable order."""
    found = []
    folders = [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir():
                    folders.append(entry.path)
                elif entry.is_file():
                    stat = entry.stat()
                    found.append((entry.path, stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))
