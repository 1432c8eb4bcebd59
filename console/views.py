"""The console's pages. Each view checks access, calls one selector or service, renders.

A page and its htmx fragments come from the same template (``page.html#partial``).
Every action is a POST with CSRF; a stale action (someone else acted first) comes back as
a clear message, never as a second action or a server error.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, connection
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRefresh, HttpResponseStopPolling

from guard import RESUME_CONDITIONS, Reason

from . import selectors, services
from .agents import UnknownAgent, agent_class
from .forms import ResolveForm, ResumeForm, StartForm, StopForm
from .models import STOP_REASONS, AuditAction, AuditEntry, TaskState
from .redaction import redact
from .roles import Capability, can, capabilities_of

logger = logging.getLogger(__name__)

View = Callable[..., HttpResponseBase]


def requires(capability: Capability) -> Callable[[View], View]:
    """Refuse (403) anyone without ``capability``; login itself is enforced by middleware."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not can(request.user, capability):
                raise PermissionDenied(f"this needs the {capability} permission")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def _page(
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    partials: frozenset[str] = frozenset(),
) -> HttpResponse:
    """Render the whole page, or just the region htmx targets when it is one of ``partials``
    (the element's id and the template partial share a name)."""
    htmx = getattr(request, "htmx", None)
    target = htmx.target if htmx else None
    if target in partials:
        template = f"{template}#{target}"
    context.setdefault("can", {cap.value: True for cap in capabilities_of(request.user)})
    return render(request, template, context)


def _done(request: HttpRequest, level: int, text: str, to: str) -> HttpResponse:
    messages.add_message(request, level, text)
    return redirect(to)


# -- dashboard and tasks -----------------------------------------------------------------------


@require_GET
@requires(Capability.READ)
def dashboard(request: HttpRequest) -> HttpResponse:
    return _page(
        request, "console/dashboard.html", {"board": selectors.dashboard()}, frozenset({"board"})
    )


@require_GET
@requires(Capability.READ)
def task_list(request: HttpRequest) -> HttpResponse:
    filters = selectors.TaskFilters.from_query(request.GET)
    page = selectors.task_page(filters, request.GET.get("page"))
    return _page(
        request,
        "console/tasks.html",
        {
            "filters": filters,
            "query": filters.as_query(),
            "page": page,
            "states": TaskState.values,
            "reasons": STOP_REASONS,
            "agents": selectors.agent_choices(),
        },
        frozenset({"results"}),
    )


@require_GET
@requires(Capability.READ)
def task_detail(request: HttpRequest, task_id: int) -> HttpResponse:
    before = _int(request.GET.get("before"))
    detail = selectors.task_detail(task_id, before=before)
    if detail is None:
        raise Http404(f"there is no task {task_id}")
    return _page(request, "console/task.html", {"d": detail, "paging_back": before is not None})


@require_GET
@requires(Capability.READ)
def task_live(request: HttpRequest, task_id: int) -> HttpResponse:
    """One tick of a task page's live view: new trace rows, gauges and status."""
    after = _int(request.GET.get("after")) or 0
    live = selectors.task_live(task_id, after=after)
    if live is None:
        return HttpResponseStopPolling()
    last_seq = live.events[-1].seq if live.events else after
    context = {"d": live, "new_events": live.events, "last_seq": last_seq, "live": True}
    context["can"] = {cap.value: True for cap in capabilities_of(request.user)}
    if live.task.is_terminal:
        # It has just stopped: load the whole page once, with its stop report, phases and
        # audit trail; that page has no poller, so the polling ends here.
        return HttpResponseClientRefresh()
    return render(request, "console/task.html#live", context)


@require_GET
@requires(Capability.READ)
def task_report_json(request: HttpRequest, task_id: int) -> HttpResponse:
    stored = selectors.latest_report(task_id)
    if stored is None:
        raise Http404(f"there is no stop report for task {task_id} (yet)")
    response = JsonResponse(stored.report, json_dumps_params={"indent": 2, "ensure_ascii": False})
    response["Content-Disposition"] = f'attachment; filename="task-{task_id}-stop-report.json"'
    return response


# -- actions -----------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@requires(Capability.STOP)
def task_stop(request: HttpRequest, task_id: int) -> HttpResponse:
    detail = selectors.task_detail(task_id)
    if detail is None:
        raise Http404(f"there is no task {task_id}")
    form = StopForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            task = services.task_stop(
                task_id=task_id, actor=_person(request), reason=form.cleaned_data["reason"]
            )
        except services.ServiceError as exc:
            return _done(request, messages.WARNING, str(exc), _task_url(task_id))
        text = (
            f"Task {task_id} stopped."
            if task.is_terminal
            else f"Stop recorded: task {task_id} ends before its next step."
        )
        return _done(request, messages.SUCCESS, text, _task_url(task_id))
    return _page(request, "console/stop.html", {"d": detail, "form": form})


@require_http_methods(["GET", "POST"])
@requires(Capability.APPROVE)
def task_resume(request: HttpRequest, task_id: int) -> HttpResponse:
    detail = selectors.task_detail(task_id)
    if detail is None:
        raise Http404(f"there is no task {task_id}")
    form = ResumeForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            services.task_approve_resumption(
                task_id=task_id,
                actor=_person(request),
                reason=form.cleaned_data["reason"],
                grant=form.grant(),
            )
        except (services.Refused, services.InvalidInput) as exc:
            form.add_error(None, str(exc))
        except services.ServiceError as exc:
            return _done(request, messages.WARNING, str(exc), _task_url(task_id))
        else:
            return _done(
                request, messages.SUCCESS, f"Task {task_id} resumes in a new phase.",
                _task_url(task_id),
            )
    budget = services.BUDGET_REASONS.get(detail.task.reason, "")
    uncertain = [op for op in detail.operations if op.state in ("UNKNOWN", "IN_FLIGHT")]
    # The stop report's condition was written when the task stopped; whether a write is
    # still uncertain is decided now.
    condition = detail.reports[0].report.get("resume_condition", "") if detail.reports else ""
    if not uncertain and detail.task.reason in {reason.value for reason in Reason}:
        condition = RESUME_CONDITIONS[Reason(detail.task.reason)]
    return _page(
        request,
        "console/resume.html",
        {"d": detail, "form": form, "budget": budget, "uncertain": uncertain,
         "condition": condition},
    )


@require_http_methods(["GET", "POST"])
@requires(Capability.START)
def task_new(request: HttpRequest) -> HttpResponse:
    initial = {}
    if name := request.GET.get("agent"):
        try:
            initial = {"agent": name, "input": json.dumps(dict(agent_class(name).example_input))}
        except UnknownAgent:
            initial = {}
    form = StartForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            task = services.task_start(
                agent=form.cleaned_data["agent"],
                input=form.cleaned_data["input"],
                limits=form.cleaned_data["limits"] or None,
                actor=_person(request),
                reason=form.cleaned_data["reason"],
            )
        except services.ServiceError as exc:
            form.add_error(None, str(exc))
        else:
            return _done(request, messages.SUCCESS, f"Task {task.id} started.", _task_url(task.id))
    agents = []
    for name in settings.LOOPGUARD_AGENTS:
        try:
            cls = agent_class(name)
        except (UnknownAgent, ImportError, TypeError):
            logger.exception("agent %s cannot be loaded", name)
            continue
        agents.append({"name": name, "title": cls.title, "description": cls.description,
                       "example": json.dumps(dict(cls.example_input))})
    return _page(request, "console/start.html", {"form": form, "agents": agents})


# -- reconciliation ----------------------------------------------------------------------------


@require_GET
@requires(Capability.READ)
def operations(request: HttpRequest) -> HttpResponse:
    return _page(request, "console/operations.html", _queue({}))


def _queue(found: dict[int, dict[str, Any]]) -> dict[str, Any]:
    now = timezone.now()
    rows = [
        {"op": op, "age": now - op.updated_at, "found": found.get(op.id)}
        for op in selectors.reconciliation_queue()
    ]
    return {"rows": rows, "total": selectors.reconciliation_count()}


@require_POST
@requires(Capability.RECONCILE)
def operation_resolve(request: HttpRequest, key: str) -> HttpResponse:
    op = selectors.operation(key)
    if op is None:
        raise Http404(f"there is no operation {key}")
    form = ResolveForm(request.POST, prefix=request.POST.get("prefix") or None)
    back = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = reverse("operations")
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in form.errors.items())
        return _done(request, messages.ERROR, f"{key} was not changed: {errors}", back)
    try:
        if form.cleaned_data["decision"] == "committed":
            services.operation_mark_committed(
                key=key,
                actor=_person(request),
                evidence=form.cleaned_data["evidence"],
                result=form.cleaned_data["result"],
            )
        else:
            services.operation_mark_not_committed(
                key=key, actor=_person(request), evidence=form.cleaned_data["evidence"]
            )
    except services.ServiceError as exc:
        return _done(request, messages.WARNING, str(exc), back)
    verdict = "committed" if form.cleaned_data["decision"] == "committed" else "not committed"
    return _done(request, messages.SUCCESS, f"{key} marked {verdict}.", back)


@require_POST
@requires(Capability.RECONCILE)
def operation_lookup(request: HttpRequest, key: str) -> HttpResponse:
    """Ask the tool's own lookup what the business system knows of ``key``; changes nothing."""
    op = selectors.operation(key)
    if op is None:
        raise Http404(f"there is no operation {key}")
    found: dict[str, Any]
    try:
        agent = agent_class(op.task.agent)(op.task.id, op.task.input, {})
        tool = next((t for t in agent.tools() if t.name == op.tool), None)
        if tool is None or tool.lookup is None:
            found = {"error": f"the tool {op.tool or '?'} has no lookup"}
        else:
            settlement = tool.lookup(key)
            found = {
                "committed": settlement.committed,
                "evidence": settlement.evidence,
                "result": None if settlement.result is None else settlement.result.to_dict(),
            }
    except Exception as exc:
        logger.exception("lookup of %s failed", key)
        found = {"error": f"the lookup failed: {type(exc).__name__}: {exc}"[:500]}
    found = redact(found)  # what a business system answers may hold secrets too
    AuditEntry.objects.create(
        actor=_person(request),
        action=AuditAction.LOOKUP,
        task_id=op.task_id,
        operation=op,
        reason="looked the operation up in the business system",
        after=found,
    )
    if getattr(request, "htmx", None):
        return _page(request, "console/operations.html#lookup", {"op": op, "found": found})
    # Without JavaScript: the whole queue, with the answer in place.
    return _page(request, "console/operations.html", _queue({op.id: found}))


# -- audit -------------------------------------------------------------------------------------


@require_GET
@requires(Capability.READ)
def audit(request: HttpRequest) -> HttpResponse:
    filters = selectors.AuditFilters.from_query(request.GET)
    page = selectors.audit_page(filters, request.GET.get("page"))
    return _page(
        request,
        "console/audit.html",
        {"filters": filters, "query": filters.as_query(), "page": page,
         "actions": AuditAction.choices},
        frozenset({"results"}),
    )


@require_GET
@requires(Capability.READ)
def audit_export(request: HttpRequest, fmt: str) -> StreamingHttpResponse:
    if fmt not in ("csv", "json"):
        raise Http404("the audit log exports as .csv or .json")
    filters = selectors.AuditFilters.from_query(request.GET)
    rows = selectors.audit_entries(filters).iterator(chunk_size=2000)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    if fmt == "json":
        response = StreamingHttpResponse(_json_lines(rows), content_type="application/json")
    else:
        response = StreamingHttpResponse(_csv_lines(rows), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="loopguard-audit-{stamp}.{fmt}"'
    return response


def _row(entry: AuditEntry) -> dict[str, Any]:
    return {
        "at": entry.at.isoformat(),
        "actor": entry.actor.get_username(),
        "action": entry.action,
        "task": entry.task_id,
        "operation": entry.operation.key if entry.operation else None,
        "reason": entry.reason,
        "before": entry.before,
        "after": entry.after,
    }


def _json_lines(rows: Iterator[AuditEntry]) -> Iterator[str]:
    yield "["
    for i, entry in enumerate(rows):
        yield ("," if i else "") + "\n" + json.dumps(_row(entry), ensure_ascii=False)
    yield "\n]\n"


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_lines(rows: Iterator[AuditEntry]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    fields = ["at", "actor", "action", "task", "operation", "reason", "before", "after"]
    yield writer.writerow(fields)
    for entry in rows:
        row = _row(entry)
        row["before"] = json.dumps(row["before"], ensure_ascii=False)
        row["after"] = json.dumps(row["after"], ensure_ascii=False)
        # A cell starting with = + - @ is a formula to a spreadsheet: neutralise it.
        yield writer.writerow([_cell(row[name]) for name in fields])


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


# -- health ------------------------------------------------------------------------------------

# A health check must answer quickly even when Redis is gone, not hang the probe.
REDIS_TIMEOUT_S = 2.0


def database_is_up() -> bool:
    """Return whether the database (PostgreSQL, or SQLite standalone) answers `SELECT 1`."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return bool(cursor.fetchone() == (1,))
    except DatabaseError:
        logger.exception("healthz: database check failed")
        return False


def redis_is_up(url: str) -> bool:
    """Return whether the Redis at ``url`` answers PING."""
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=REDIS_TIMEOUT_S,
        socket_timeout=REDIS_TIMEOUT_S,
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        logger.exception("healthz: redis check failed")
        return False
    finally:
        client.close()


def broker_folders_are_up() -> bool:
    """Return whether the filesystem broker's folders exist and this process can write them."""
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    folders = {Path(str(options[name])) for name in ("data_folder_in", "data_folder_out")}
    missing = [str(f) for f in folders if not (f.is_dir() and os.access(f, os.W_OK | os.X_OK))]
    if missing:
        logger.error("healthz: broker folder(s) missing or not writable: %s", ", ".join(missing))
    return not missing


def broker_check() -> tuple[str, bool]:
    """The configured broker's name in the health answer, and whether it is reachable."""
    if urlsplit(settings.CELERY_BROKER_URL).scheme == "filesystem":
        return "broker", broker_folders_are_up()
    return "redis", redis_is_up(settings.CELERY_BROKER_URL)


@login_not_required
@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when the database and the broker both respond, 503 otherwise.

    The broker is Redis (shown as ``redis``) or, in standalone mode, kombu's filesystem
    transport (``broker``: its folders are there and writable). Only "ok"/"down" per
    dependency is shown: error details go to the log, not to whoever can reach this URL.
    """
    broker, broker_up = broker_check()
    checks = {"database": database_is_up(), broker: broker_up}
    healthy = all(checks.values())
    return JsonResponse(
        {
            "status": "ok" if healthy else "unavailable",
            "checks": {name: "ok" if up else "down" for name, up in checks.items()},
        },
        status=200 if healthy else 503,
    )


def _person(request: HttpRequest) -> User:
    """The signed-in person acting (the middleware lets no one else this far)."""
    if not isinstance(request.user, User):
        raise PermissionDenied("a signed-in person is required")
    return request.user


def _int(raw: str | None) -> int | None:
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _task_url(task_id: int) -> str:
    return reverse("task", args=[task_id])

