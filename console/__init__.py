"""LoopGuard's operator console: a Django project (settings, URLs, WSGI/ASGI entry points)."""
