"""How pages meet the person reading them: the console's own error pages in development
too, a 503 rather than a 500 while the database cannot answer, and times in the viewer's
time zone.

Configuration, wired in by the settings (``MIDDLEWARE``, ``CSRF_FAILURE_VIEW``); nothing
here decides anything about tasks.
"""

from __future__ import annotations

import sys
import zoneinfo
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.signals import got_request_exception
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.api.views import DATABASE_RETRY_AFTER_SECONDS, database_outage, database_unavailable

__all__ = [
    "TIME_ZONE_COOKIE",
    "BrandedNotFound",
    "DatabaseUnavailable",
    "ViewerTimeZone",
    "csrf_failure",
]

TIME_ZONE_COOKIE = "loopguard_tz"
"""Set by static/console/timezone.js from the browser's own zone (an IANA name)."""


class BrandedNotFound:
    """With ``DEBUG`` on (``manage.py up``'s development mode) Django answers a missing page
    with its technical page, which lists the URL map: people get the console's own 404
    page, with its navigation, as in production. JSON answers (the API's) are left alone."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            settings.DEBUG
            and response.status_code == 404
            and response.get("Content-Type", "").startswith("text/html")
        ):
            return render(request, "404.html", status=404)
        return response


class DatabaseUnavailable:
    """A request the database could not serve (down, restarting, the connection lost
    mid-request) is answered 503 with ``Retry-After``, not 500: a plain page (the console's
    own needs the database for its navigation), or the API's JSON error under ``/api/``.

    The API's views answer so themselves; this catches the rest, wherever it failed: in a
    view, or in a middleware such as the sign-in check that loads the session, whose
    exceptions Django turns into a 500 before any ``process_exception`` sees them. Django
    sends ``got_request_exception`` while it does, inside its ``except`` block (under WSGI,
    as gunicorn serves the console), so the exception is at hand there; the 500 is replaced
    on its way out. Django has logged it by then, with its traceback.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        got_request_exception.connect(_note_outage, dispatch_uid=f"{__name__}.outage")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not getattr(request, _OUTAGE, False):
            return response
        if request.path_info.startswith("/api/"):
            return database_unavailable()
        unavailable = HttpResponse(_UNAVAILABLE_PAGE, status=503)
        unavailable["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        unavailable["Cache-Control"] = "no-store"
        return unavailable


_OUTAGE = "_loopguard_database_outage"
_UNAVAILABLE_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Unavailable · LoopGuard</title></head>
<body><h1>The console cannot reach its database</h1>
<p>It may be restarting. Try again in a few seconds.</p>
<p>If you sent a form, look whether it took effect before you send it again.</p>
</body></html>
"""


def _note_outage(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    exc = sys.exception()
    if request is not None and exc is not None and database_outage(exc):
        setattr(request, _OUTAGE, True)


class ViewerTimeZone:
    """Pages show times in the zone the viewer's browser is in (told by a cookie, checked
    against the zone database); without one, in UTC. Exports and the API always write UTC."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        zone = _zone(unquote(request.COOKIES.get(TIME_ZONE_COOKIE, "")))
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def _zone(name: str) -> zoneinfo.ZoneInfo | None:
    if not name or len(name) > 64:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None  # a cookie is anybody's to write: a bad one means UTC


@login_not_required
def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A form refused by the CSRF check: the console's page, saying what to do."""
    return render(request, "403_csrf.html", status=403)
