"""Shared pytest setup. Django is configured by pytest-django from pyproject.toml.

Tests use the real PostgreSQL and Redis at the defaults in `console/project/settings.py`
(override with DATABASE_URL and REDIS_URL); `.ci/run` starts both.
"""
