"""WSGI entry point for the console (e.g. `gunicorn console.project.wsgi`)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.project.settings")

application = get_wsgi_application()
