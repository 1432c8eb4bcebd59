"""The Django project: settings, the URL map, the WSGI/ASGI entry points, Celery and gunicorn.

Configuration only; the console application itself is the ``console`` package around it.
"""
