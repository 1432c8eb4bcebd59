"""The health endpoint reports whether the console can reach its database and its broker."""

from pathlib import Path

import pytest
from django.test import Client
from pytest_django import Settings

from console.web import health

pytestmark = pytest.mark.django_db


def test_it_answers_200_when_database_and_redis_respond(client: Client) -> None:
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}
    assert "no-cache" in response["Cache-Control"]


def test_it_answers_503_and_names_redis_when_redis_is_unreachable(
    client: Client, settings: Settings
) -> None:
    # Port 1 on loopback refuses connections at once: a real failure, no mock.
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "checks": {"database": "ok", "redis": "down"},
    }


def filesystem_broker(settings: Settings, folder: Path) -> None:
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
    }


def test_in_standalone_mode_it_checks_the_broker_folders_instead_of_redis(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # not the broker: not asked
    filesystem_broker(settings, tmp_path)

    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}


def test_it_answers_503_when_the_broker_folder_is_missing(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    filesystem_broker(settings, tmp_path / "gone")

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "broker": "down"}


def test_it_refuses_anything_but_get(client: Client) -> None:
    assert client.post("/healthz").status_code == 405


def test_the_probes_answer_without_a_request_each_dependency_by_name() -> None:
    found = health.health()

    assert found.healthy
    assert found.checks == {"database": True, "redis": True}
