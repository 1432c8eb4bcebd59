"""Django's PostgreSQL backend with a health check that costs no round trip (``base``).

``settings.DATABASES`` names this package as the ``ENGINE`` of a PostgreSQL URL; Django
loads its ``base`` module by that name, and nothing imports it otherwise.
"""
