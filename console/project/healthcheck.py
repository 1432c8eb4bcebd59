"""The web container's health check: ``python console/project/healthcheck.py`` exits 0 when healthy.

It asks the console's own ``/healthz`` (database and Redis reachable) over loopback. Only
the standard library, so a check every few seconds costs no Django start-up. The request
names a host from ``DJANGO_ALLOWED_HOSTS``: Django answers 400 to any other Host header.
"""

from __future__ import annotations

import http.client
import os
import sys

PORT = 8000  # where the image's gunicorn listens (Dockerfile)


def allowed_host(setting: str) -> str:
    """A Host header Django accepts: the first allowed host (``.example.com`` and ``*``
    are patterns, so a name matching them is made up)."""
    first = next((h.strip() for h in setting.split(",") if h.strip()), "localhost")
    if first == "*":
        return "localhost"
    if first.startswith("."):
        return "health" + first
    return first


def main() -> int:
    host = allowed_host(os.environ.get("DJANGO_ALLOWED_HOSTS", ""))
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    try:
        connection.request("GET", "/healthz", headers={"Host": host})
        response = connection.getresponse()
        body = response.read(500).decode(errors="replace")
    except OSError as error:
        print(f"healthz: no answer on port {PORT}: {error}", file=sys.stderr)
        return 1
    finally:
        connection.close()
    if response.status != 200:
        print(f"healthz: {response.status} {body}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
