"""The static files' table: read once per process, read again when a file changes."""

import os

from common.static_files import StaticFilesMiddleware


def build():
    return StaticFilesMiddleware(get_response=lambda request: None)


def test_a_second_middleware_reuses_what_the_first_read(settings, tmp_path):
    settings.STATIC_ROOT = str(tmp_path)
    (tmp_path / "hub.css").write_text("body { margin: 0 }")
    first, second = build(), build()
    url = f"/{settings.STATIC_URL.strip('/')}/hub.css"
    assert second.files[url] is first.files[url]
    # And finders' files too (DEBUG serves the apps' folders): the admin's stylesheet.
    settings.WHITENOISE_USE_FINDERS = True
    admin_css = f"/{settings.STATIC_URL.strip('/')}/admin/css/base.css"
    assert build().files[admin_css] is build().files[admin_css]


def test_a_file_written_again_is_read_again(settings, tmp_path, rf):
    settings.STATIC_ROOT = str(tmp_path)
    stylesheet = tmp_path / "hub.css"
    stylesheet.write_text("body { margin: 0 }")
    url = f"/{settings.STATIC_URL.strip('/')}/hub.css"
    before = build().files[url]
    stylesheet.write_text("body { margin: 0; padding: 0 }")
    stat = stylesheet.stat()
    os.utime(stylesheet, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    middleware = build()
    assert middleware.files[url] is not before
    response = middleware(rf.get(url))
    assert response.status_code == 200
    assert int(response["Content-Length"]) == len("body { margin: 0; padding: 0 }")


def test_options_that_shape_the_headers_are_not_shared(settings, tmp_path, rf):
    settings.STATIC_ROOT = str(tmp_path)
    (tmp_path / "hub.css").write_text("body { margin: 0 }")
    url = f"/{settings.STATIC_URL.strip('/')}/hub.css"
    settings.WHITENOISE_MAX_AGE = 60
    assert "max-age=60" in build()(rf.get(url))["Cache-Control"]
    settings.WHITENOISE_MAX_AGE = 600
    assert "max-age=600" in build()(rf.get(url))["Cache-Control"]
