"""docker-compose.yml describes the production shape, and every knob it turns is documented.

The structure is checked from the YAML itself, so these run anywhere; the one test that
asks a Docker Compose client whether it accepts the file skips (saying why) without one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.processes import run, run_python

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SETTINGS_DOC = ROOT / "docs" / "settings.md"
SETTINGS = ROOT / "console" / "project" / "settings.py"

APP_SERVICES = ("web", "worker", "beat")
# ${NAME}, ${NAME:-default}, ${NAME:?error}, $NAME; "$$" is a literal dollar for the shell.
COMPOSE_VARIABLE = re.compile(r"(?<!\$)\$\{?([A-Za-z_][A-Za-z0-9_]*)")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict), "docker-compose.yml is a mapping"
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose.get("services")
    assert isinstance(found, dict), "docker-compose.yml has services"
    return found


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def compose_variables(compose: dict[str, Any]) -> set[str]:
    """Every variable docker-compose.yml interpolates (from its values, not its comments)."""
    return {name for text in _strings(compose) for name in COMPOSE_VARIABLE.findall(text)}


def example_variables() -> set[str]:
    """Variables .env.example sets or shows commented out (``# NAME=value``)."""
    return set(re.findall(r"^#? ?([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.MULTILINE))


def documented_variables() -> set[str]:
    """Variables docs/settings.md describes (as `NAME` in its tables)."""
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)`", SETTINGS_DOC.read_text(), re.MULTILINE))


def settings_variables() -> set[str]:
    """Environment variables the settings module reads, through its helpers or os.environ."""
    source = SETTINGS.read_text()
    helpers = re.findall(r"\benv_[a-z_]+\(\s*\"([A-Z][A-Z0-9_]*)\"", source)
    direct = re.findall(r"os\.environ(?:\.get)?[(\[]\s*\"([A-Z][A-Z0-9_]*)\"", source)
    return set(helpers) | set(direct)


# -- structure -------------------------------------------------------------------------------


def test_it_has_the_production_services(services: dict[str, dict[str, Any]]) -> None:
    assert {"postgres", "redis", "migrate", *APP_SERVICES} <= set(services)
    assert str(services["postgres"]["image"]).startswith("postgres:16")
    assert str(services["redis"]["image"]).startswith("redis:7")


def test_the_web_runs_gunicorn_and_the_others_celery(services: dict[str, dict[str, Any]]) -> None:
    dockerfile = (ROOT / "console" / "Dockerfile").read_text()
    assert "command" not in services["web"], "web runs the image's command"
    assert re.search(r'^CMD \["gunicorn"', dockerfile, re.MULTILINE)
    for module in re.findall(r'"python:([\w.]+)"', dockerfile):  # gunicorn's config module
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module
    assert services["worker"]["command"][:3] == ["celery", "--app=console", "worker"]
    assert services["beat"]["command"][:3] == ["celery", "--app=console", "beat"]
    assert services["migrate"]["command"] == ["django-admin", "migrate", "--noinput"]


def test_beat_is_never_scaled(services: dict[str, dict[str, Any]]) -> None:
    beat = services["beat"]
    replicas = (beat.get("deploy") or {}).get("replicas", 1)
    assert replicas <= 1, "a second beat doubles every sweep"
    assert "scale" not in beat


def test_beat_does_not_also_run_inside_a_worker(services: dict[str, dict[str, Any]]) -> None:
    worker = " ".join(services["worker"]["command"])
    assert not re.search(r"(^| )(-B|--beat)( |$)", worker), "beat runs once, in its own service"


def test_the_app_waits_for_migrations_which_wait_for_postgres(
    services: dict[str, dict[str, Any]],
) -> None:
    migrate = services["migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate["restart"] == "no"
    for name in APP_SERVICES:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["redis"]["condition"] == "service_healthy", name


def test_long_running_services_have_health_checks(services: dict[str, dict[str, Any]]) -> None:
    for name in ("postgres", "redis", "web", "worker"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has a health check"
    assert "console/project/healthcheck.py" in services["web"]["healthcheck"]["test"]
    assert "inspect ping" in " ".join(services["worker"]["healthcheck"]["test"])


def test_state_lives_in_volumes(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert "postgres-data:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert "redis-data:/data" in services["redis"]["volumes"]
    assert {"postgres-data", "redis-data"} <= set(compose["volumes"])


def test_the_app_reads_dot_env_with_debug_off_unless_it_says_otherwise(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in (*APP_SERVICES, "migrate"):
        service = services[name]
        assert service["env_file"] == ".env", name
        assert service["environment"]["DJANGO_DEBUG"] == "${DJANGO_DEBUG:-0}", name
    assert re.search(r"^DJANGO_DEBUG=0$", ENV_EXAMPLE.read_text(), re.MULTILINE)


def _load_settings(**env: str) -> subprocess.CompletedProcess[str]:
    """Import the settings in a fresh interpreter with only ``env`` set."""
    env = {"PATH": "/usr/bin:/bin", **env}
    return run_python("import console.project.settings", env=env, timeout=60)


def test_the_example_secret_key_is_a_placeholder_the_settings_refuse() -> None:
    key = re.search(r"^DJANGO_SECRET_KEY=(.*)$", ENV_EXAMPLE.read_text(), re.MULTILINE)
    assert key is not None

    refused = _load_settings(DJANGO_DEBUG="0", DJANGO_SECRET_KEY=key[1])
    accepted = _load_settings(DJANGO_DEBUG="0", DJANGO_SECRET_KEY="k3y-" * 13)

    assert refused.returncode != 0
    assert "DJANGO_SECRET_KEY must be a real secret" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr


def test_the_example_metrics_token_is_a_placeholder_the_settings_refuse() -> None:
    token = re.search(r"^LOOPGUARD_METRICS_TOKEN=(.*)$", ENV_EXAMPLE.read_text(), re.MULTILINE)
    assert token is not None

    refused = _load_settings(LOOPGUARD_METRICS_TOKEN=token[1])

    assert refused.returncode != 0
    assert "LOOPGUARD_METRICS_TOKEN must be a secret" in refused.stderr


def test_only_the_web_console_is_published(services: dict[str, dict[str, Any]]) -> None:
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"web"}
    assert services["web"]["ports"] == ["${LOOPGUARD_HTTP_PUBLISH:-127.0.0.1:8000}:8000"]


# -- documentation ---------------------------------------------------------------------------


def test_every_variable_compose_uses_is_in_the_example_and_the_reference(
    compose: dict[str, Any],
) -> None:
    used = compose_variables(compose)
    assert {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "DJANGO_DEBUG"} <= used  # the regex works
    assert used - example_variables() == set(), "missing from .env.example"
    assert used - documented_variables() == set(), "missing from docs/settings.md"


def test_every_variable_the_settings_read_is_in_the_reference() -> None:
    read = settings_variables()
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "LOOPGUARD_METRICS_TOKEN"} <= read
    assert read - documented_variables() == set(), "missing from docs/settings.md"


def test_the_example_names_nothing_the_reference_does_not_explain() -> None:
    assert example_variables() - documented_variables() == set()


# -- a real Compose client -------------------------------------------------------------------


def _compose_client() -> list[str] | None:
    """``docker compose`` (v2) or ``docker-compose`` (v1), whichever answers."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for command in candidates:
        probe = run([*command, "version"], timeout=60)
        if probe.returncode == 0:
            return command
    return None


def _config(client: list[str], project: Path) -> subprocess.CompletedProcess[str]:
    # A bare environment: interpolation must come from the project's .env file only.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(project)}
    return run(
        [*client, "--project-directory", str(project), "-f", str(project / COMPOSE.name), "config"],
        cwd=project,
        env=env,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the compose project with .env made from .env.example, as the docs say."""
    (tmp_path / "console").mkdir()
    for name in ("docker-compose.yml", "console/Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ENV_EXAMPLE, tmp_path / ".env")
    return tmp_path


def test_docker_compose_config_accepts_it(project: Path) -> None:
    client = _compose_client()
    if client is None:
        pytest.skip("no Docker Compose client (docker compose / docker-compose) on PATH")

    result = _config(client, project)

    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    web = resolved["services"]["web"]["environment"]
    assert web["DATABASE_URL"] == (
        "postgres://loopguard:change-me-postgres@postgres:5432/loopguard"
    )
    assert web["REDIS_URL"] == "redis://:change-me-redis@redis:6379/0"
    assert str(web["DJANGO_DEBUG"]) == "0"
    assert resolved["services"]["beat"].get("deploy", {}).get("replicas", 1) == 1


def test_docker_compose_config_refuses_a_missing_password(project: Path) -> None:
    client = _compose_client()
    if client is None:
        pytest.skip("no Docker Compose client (docker compose / docker-compose) on PATH")
    env_file = project / ".env"
    env_file.write_text(re.sub(r"^POSTGRES_PASSWORD=.*\n", "", env_file.read_text(), flags=re.M))

    result = _config(client, project)

    assert result.returncode != 0
    assert "set POSTGRES_PASSWORD" in result.stderr
