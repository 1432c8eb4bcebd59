"""The JSON API: the console's reads and actions for programs, authenticated by bearer token.

A request proves who it acts for with ``Authorization: Bearer <token>`` and nothing else:
the API never looks at the browser session, so a page on another site cannot make a
signed-in person's browser act through it (there are no cookies to ride on, which is also
why CSRF does not apply). The token's user then needs the same role the console asks for
(:func:`console.roles.can`), and every action goes through the same service as the console,
so state moves, stale actions and audit entries are the same whichever door was used.

Every answer is JSON; every failure is ``{"error": "..."}`` with a status a client can act
on: 400 malformed, 401 no usable token, 403 missing role, 404 unknown, 405 wrong method,
409 stale or refused action, 413 body over 1 MiB.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from . import selectors, services
from .models import ApiToken, Operation, Phase, StopReport, Task, TraceEvent
from .roles import Capability, can

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
# Makes a leaked token recognisable to secret scanners and people; not a secret itself.
TOKEN_PREFIX = "lg_"  # noqa: S105
PREFIX_LENGTH = 8
MAX_TOKEN_LENGTH = 200  # longer than any token we issue: not worth hashing
# ``last_used_at`` is written at most this often per token, so that a busy client does not
# turn every read into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)
CHALLENGE = 'Bearer realm="loopguard"'


# -- tokens ------------------------------------------------------------------------------------


def api_token_digest(secret: str) -> str:
    """What is stored for ``secret``: its SHA-256, in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_issue(*, user: User, name: str) -> tuple[ApiToken, str]:
    """Create a token for ``user``; returns it with its secret, which is never stored.

    The caller must show the secret now: afterwards only its hash and prefix exist.
    """
    name = name.strip()
    if not name:
        raise services.InvalidInput("a token needs a name")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name[:100],
        key_hash=api_token_digest(secret),
        prefix=secret[:PREFIX_LENGTH],
    )
    return token, secret


def api_token_for(secret: str) -> ApiToken | None:
    """The token whose secret this is (revoked or not), or None."""
    if not secret or len(secret) > MAX_TOKEN_LENGTH:
        return None
    digest = api_token_digest(secret)
    token = ApiToken.objects.select_related("user").filter(key_hash=digest).first()
    # The lookup compares hashes in the database, not in constant time; checking again with
    # compare_digest keeps the final decision free of timing differences all the same.
    if token is None or not hmac.compare_digest(token.key_hash, digest):
        return None
    return token


def _mark_used(token: ApiToken) -> None:
    now = timezone.now()
    due = now - LAST_USED_RESOLUTION
    if token.last_used_at is not None and token.last_used_at >= due:
        return
    # Conditional, so that concurrent requests write once and never move the time back.
    ApiToken.objects.filter(id=token.id).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=due)
    ).update(last_used_at=now)
    token.last_used_at = now


# -- requests and answers ----------------------------------------------------------------------


class ApiError(Exception):
    """A failure answered as ``{"error": message}`` with ``status``."""

    def __init__(
        self, status: int, message: str, *, headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def response(self) -> JsonResponse:
        response = JsonResponse({"error": self.message, **self.extra}, status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def _unauthorized(message: str, code: str = "") -> ApiError:
    challenge = f'{CHALLENGE}, error="{code}"' if code else CHALLENGE
    return ApiError(401, message, headers={"WWW-Authenticate": challenge})


# A ServiceError's message is written for the person who asked; the status says what kind.
SERVICE_STATUS: dict[type[services.ServiceError], int] = {
    services.NotFound: 404,
    services.InvalidInput: 400,
    services.StaleState: 409,
    services.Refused: 409,
}


def _service_status(exc: services.ServiceError) -> int:
    for kind, status in SERVICE_STATUS.items():
        if isinstance(exc, kind):
            return status
    return 409  # a refusal we have no better word for: the request was understood


@dataclass(frozen=True)
class ApiCall:
    """One authenticated API request: who, with which token, with what body."""

    request: HttpRequest
    token: ApiToken
    body: dict[str, Any]

    @property
    def user(self) -> User:
        return self.token.user


Handler = Callable[..., HttpResponse]


@dataclass(frozen=True)
class Action:
    """What one HTTP method of an endpoint needs (a capability) and does (a handler)."""

    capability: Capability
    handler: Handler


def endpoint(*, get: Action | None = None, post: Action | None = None) -> Handler:
    """A view answering only the given methods, each after token and role checks."""
    actions = {method: action for method, action in (("GET", get), ("POST", post)) if action}
    allowed = ", ".join(actions)

    # login_not_required: the token is the login, so the session middleware must not
    # redirect to the login page. csrf_exempt: no cookie authenticates here (see above).
    @login_not_required
    @csrf_exempt
    @never_cache
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        action = actions.get(request.method or "")
        if action is None:
            return ApiError(
                405, f"{request.method} is not allowed here; use {allowed}",
                headers={"Allow": allowed},
            ).response()
        try:
            token = _authenticate(request)
            if not can(token.user, action.capability):
                raise ApiError(403, f"this needs the {action.capability} permission")
            body = _body(request) if request.method == "POST" else {}
            return action.handler(ApiCall(request, token, body), **kwargs)
        except ApiError as exc:
            return exc.response()
        except services.ServiceError as exc:
            return ApiError(_service_status(exc), str(exc)).response()
        except Exception:
            # A client gets JSON even when we fail; the details go to the log, not to it.
            logger.exception("API %s %s failed", request.method, request.path)
            return ApiError(500, "internal error; it has been logged").response()

    return view


def _authenticate(request: HttpRequest) -> ApiToken:
    header = request.META.get("HTTP_AUTHORIZATION", "").strip()
    if not header:
        raise _unauthorized("an API token is required: send Authorization: Bearer <token>")
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise _unauthorized(
            "the Authorization header must be Bearer <token>", "invalid_request"
        )
    token = api_token_for(secret)
    if token is None:
        raise _unauthorized("the token is not valid", "invalid_token")
    if token.is_revoked:
        raise _unauthorized("the token has been revoked", "invalid_token")
    if not token.user.is_active:
        raise _unauthorized("the token's user is deactivated", "invalid_token")
    _mark_used(token)
    # Whatever the session said, this request acts as the token's user.
    request.user = token.user
    return token


def _body(request: HttpRequest) -> dict[str, Any]:
    too_big = ApiError(413, f"the body is larger than {MAX_BODY_BYTES // 1024 // 1024} MiB")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "Content-Length is not a number") from None
    # Refuse on the declared length, before reading a byte of it.
    if declared > MAX_BODY_BYTES:
        raise too_big
    try:
        raw = request.body
    except RequestDataTooBig:
        raise too_big from None
    if len(raw) > MAX_BODY_BYTES:
        raise too_big
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object, like {\"reason\": \"...\"}")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _fields(body: Mapping[str, Any], *known: str) -> None:
    """Refuse fields we do not know: a typo (``"reasn"``) must not pass silently."""
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise ApiError(
            400, f"unknown field(s): {', '.join(unknown)}; expected: {', '.join(known)}"
        )


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string")
    return value


def _object(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, f"{name} must be a JSON object")
    return value


def _query_int(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdecimal() or len(raw) > 18:
        raise ApiError(400, f"{name} must be a whole number ≥ 0")
    return int(raw)


# -- what a client sees ------------------------------------------------------------------------


def _username(user: User | None) -> str | None:
    return None if user is None else user.get_username()


def task_json(task: Task) -> dict[str, Any]:
    """A task as the list and the actions show it."""
    return {
        "id": task.id,
        "url": reverse("api:task", args=[task.id]),
        "agent": task.agent,
        "state": task.state,
        "reason": task.reason,
        "detail": task.detail,
        "phase": task.phase,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "finished_at": task.finished_at,
        "stop_requested_at": task.stop_requested_at,
        "counters": {name: getattr(task, name) for name in selectors.BUDGETS},
        "revision": task.revision,
        "limits": task.limits,
    }


def operation_json(op: Operation) -> dict[str, Any]:
    """A ledger operation, without its stored result (the trace shows a preview)."""
    return {
        "key": op.key,
        "resolve_url": reverse("api:operation-resolve", kwargs={"key": op.key}),
        "task": op.task_id,
        "state": op.state,
        "tool": op.tool,
        "args_preview": op.args_preview,
        "attempts": op.attempts,
        "evidence": op.evidence,
        "claimed_at": op.claimed_at,
        "updated_at": op.updated_at,
    }


def _phase_json(phase: Phase) -> dict[str, Any]:
    return {
        "number": phase.number,
        "state": phase.state,
        "reason": phase.reason,
        "started_at": phase.started_at,
        "ended_at": phase.ended_at,
        "approved_by": _username(phase.approved_by),
        "approval_note": phase.approval_note,
        "grant": phase.grant,
        "usage_at_start": phase.usage_at_start,
    }


def _report_json(report: StopReport) -> dict[str, Any]:
    return {
        "phase": report.phase,
        "at": report.at,
        "state": report.state,
        "reason": report.reason,
        "report": report.report,
    }


def _event_json(event: TraceEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "phase": event.phase,
        "at": event.at,
        "kind": event.kind,
        "decision": event.decision,
        "reason": event.reason,
        "tool": event.tool,
        "fingerprint": event.fingerprint,
        "args_preview": event.args_preview,
        "result_kind": event.result_kind,
        "result_preview": event.result_preview,
        "revision": event.revision,
        "operation_key": event.operation_key,
        "latency_ms": event.latency_ms,
        "tokens": event.tokens,
        "detail": event.detail,
    }


# -- endpoints ---------------------------------------------------------------------------------


def _task_list(call: ApiCall) -> HttpResponse:
    filters = selectors.TaskFilters.from_query(call.request.GET)
    if filters.errors:
        # The console drops a bad filter and says so; a program would silently get every
        # task instead of the ones it asked for, so it is refused here.
        message = "; ".join(f"{name}: {text}" for name, text in filters.errors.items())
        raise ApiError(400, message, extra={"fields": filters.errors})
    number = _query_int(call.request, "page")
    if number == 0:
        raise ApiError(400, "page numbers start at 1")
    page = selectors.task_page(filters, number or 1)
    return JsonResponse({
        "tasks": [task_json(task) for task in page],
        "page": {
            "number": page.number,
            "pages": page.paginator.num_pages,
            "per_page": page.paginator.per_page,
            "count": page.paginator.count,
            "next": page.next_page_number() if page.has_next() else None,
            "previous": page.previous_page_number() if page.has_previous() else None,
        },
    })


def _task_start(call: ApiCall) -> HttpResponse:
    _fields(call.body, "agent", "input", "limits", "reason")
    agent = _text(call.body, "agent").strip()
    if not agent:
        raise ApiError(400, "agent is required")
    task = services.task_start(
        agent=agent,
        input=_object(call.body, "input"),
        limits=_object(call.body, "limits"),
        actor=call.user,
        reason=_text(call.body, "reason").strip()
        or f"started through the API with token {call.token.prefix}… ({call.token.name})",
    )
    response = JsonResponse({"task": task_json(task)}, status=201)
    response["Location"] = reverse("api:task", args=[task.id])
    return response


def _task_detail(call: ApiCall, task_id: int) -> HttpResponse:
    after = _query_int(call.request, "after")
    before = _query_int(call.request, "before")
    if after is not None and before is not None:
        raise ApiError(400, "ask for events after or before a seq, not both")
    detail = selectors.task_detail(task_id, before=before)
    if detail is None:
        raise ApiError(404, f"there is no task {task_id}")
    events = detail.events
    last_seq = detail.last_seq
    if after is not None:
        # A client following a live task asks only for what it has not seen yet.
        events = selectors.trace(task_id, after=after)
        last_seq = events[-1].seq if events else after
    task = detail.task
    return JsonResponse({
        "task": {
            **task_json(task),
            "input": task.input,
            "created_by": _username(task.created_by),
            "stop_requested_by": _username(task.stop_requested_by),
            "stop_note": task.stop_note,
        },
        "gauges": [
            {"name": g.name, "used": g.used, "limit": g.limit, "percent": g.percent,
             "level": g.level}
            for g in detail.gauges
        ],
        "operations": [operation_json(op) for op in detail.operations],
        "phases": [_phase_json(phase) for phase in detail.phases],
        "stop_report": _report_json(detail.reports[0]) if detail.reports else None,
        "events": [_event_json(event) for event in events],
        "last_seq": last_seq,
        # Older events exist before this window (page back with ?before=<first seq>).
        "earlier": bool(events) and events[0].seq > 1,
        # The window is full: there may be newer events (ask again with ?after=last_seq).
        "more": after is not None and len(events) == selectors.TRACE_WINDOW,
    })


def _task_stop(call: ApiCall, task_id: int) -> HttpResponse:
    _fields(call.body, "reason")
    task = services.task_stop(task_id=task_id, actor=call.user, reason=_text(call.body, "reason"))
    # 202: a running task only has the stop recorded; its driver ends it before its next
    # step, so the client should watch the task until it is terminal.
    return JsonResponse({"task": task_json(task)}, status=200 if task.is_terminal else 202)


def _task_resume(call: ApiCall, task_id: int) -> HttpResponse:
    _fields(call.body, "reason", "grant")
    task = services.task_approve_resumption(
        task_id=task_id,
        actor=call.user,
        reason=_text(call.body, "reason"),
        grant=_object(call.body, "grant"),
    )
    return JsonResponse({"task": task_json(task)})


def _operation_list(call: ApiCall) -> HttpResponse:
    return JsonResponse(
        {"operations": [operation_json(op) for op in selectors.reconciliation_queue()]}
    )


def _operation_resolve(call: ApiCall, key: str) -> HttpResponse:
    _fields(call.body, "committed", "evidence", "result")
    committed = call.body.get("committed")
    if not isinstance(committed, bool):
        raise ApiError(400, "committed must be true (it happened) or false (it did not)")
    evidence = _text(call.body, "evidence")
    if committed:
        op = services.operation_mark_committed(
            key=key, actor=call.user, evidence=evidence, result=call.body.get("result")
        )
    else:
        if call.body.get("result") is not None:
            raise ApiError(400, "a result only goes with committed: true")
        op = services.operation_mark_not_committed(key=key, actor=call.user, evidence=evidence)
    return JsonResponse({"operation": operation_json(op)})


tasks = endpoint(
    get=Action(Capability.READ, _task_list), post=Action(Capability.START, _task_start)
)
task = endpoint(get=Action(Capability.READ, _task_detail))
task_stop = endpoint(post=Action(Capability.STOP, _task_stop))
task_resume = endpoint(post=Action(Capability.APPROVE, _task_resume))
operations = endpoint(get=Action(Capability.READ, _operation_list))
operation_resolve = endpoint(post=Action(Capability.RECONCILE, _operation_resolve))


@login_not_required
@csrf_exempt
@never_cache
def not_found(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    """Any other path under the API: a JSON 404, not the console's HTML page."""
    return ApiError(404, f"there is no API endpoint at {request.path}").response()
