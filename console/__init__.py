"""LoopGuard's operator console: a Django project (settings, URLs, WSGI/ASGI entry points).

The Celery app is loaded with Django so that ``@shared_task`` tasks bind to it and
``delay()`` from a web request uses the configured broker.
"""

from console.project.celery import app as celery_app

__all__ = ["celery_app"]
