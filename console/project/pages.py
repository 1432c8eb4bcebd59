"""How pages meet the person reading them: the console's own error pages in development
too, and times in the viewer's time zone.

Configuration, wired in by the settings (``MIDDLEWARE``, ``CSRF_FAILURE_VIEW``); nothing
here decides anything about tasks.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from urllib.parse import unquote

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

__all__ = ["TIME_ZONE_COOKIE", "BrandedNotFound", "ViewerTimeZone", "csrf_failure"]

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
