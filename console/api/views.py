"""The JSON API's views: authenticate, parse, call one service or selector, answer.

A request proves who it acts for with ``Authorization: Bearer <token>``
(:mod:`console.api.tokens`): the API's data and actions never look at the browser session, so
a page on another site cannot make a signed-in person's browser act through it (there are
no cookies to ride on, which is also why CSRF does not apply). The one exception is the
description at ``/api/openapi.json``: it holds no data and changes nothing, so a signed-in
session may read it too. The user then needs the same role the console asks for
(:func:`console.records.roles.can`), and every action goes through the same service as the console,
so state moves, stale actions and audit entries are the same whichever door was used.

Every answer is JSON (shapes in :mod:`console.api.serializers`, described by
:mod:`console.api.openapi`); every failure is ``{"error": "...", "code": "..."}`` whose code
fixes its status: 400 malformed, 401 no usable token, 403 missing role, 404 unknown, 405
wrong method, 409 stale or refused action, 413 body over 1 MiB, 503 (with ``Retry-After``)
when the database cannot answer now.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from console import selectors, services
from console.api import openapi
from console.api import serializers as s
from console.api.serializers import ErrorCode
from console.api.tokens import TokenRefused, api_token_authenticate
from console.drivers import attached
from console.models import ApiToken, ApprovalState
from console.records.inputs import InputRefused, key_problem, load_json
from console.records.roles import Capability, can

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
CHALLENGE = 'Bearer realm="loopguard"'
# How long a client waits before it asks again when the database cannot answer: a
# connection lost mid-request is fine at once, a restart takes a few seconds, and
# guard.remote's three retries then cover about six.
DATABASE_RETRY_AFTER_SECONDS = 2


# -- requests and answers ----------------------------------------------------------------------


class ApiError(Exception):
    """A failure answered as :data:`console.api.serializers.ERROR` with its code's status."""

    def __init__(
        self, code: ErrorCode, message: str, *, headers: Mapping[str, str] | None = None,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.fields = dict(fields) if fields else None

    def response(self) -> JsonResponse:
        response = JsonResponse(s.ERROR.dump(self), status=self.code.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def database_outage(exc: BaseException) -> bool:
    """Whether ``exc`` comes of a database that cannot answer now (down, restarting, the
    connection lost mid-request), itself or what it was raised from or while handling: a
    driver may re-raise such an error as a ``DatabaseError`` of its own."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; a cycle in it must not hang the request
        if seen is None:
            return False
        if isinstance(seen, (OperationalError, InterfaceError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def database_unavailable() -> JsonResponse:
    """The answer to a request the database could not serve: a 503 saying when to ask again."""
    return ApiError(
        ErrorCode.DATABASE_UNAVAILABLE,
        "the console's database is not answering (it may be restarting); send the request "
        f"again in {DATABASE_RETRY_AFTER_SECONDS} seconds",
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
    ).response()


def _unauthorized(code: ErrorCode, message: str) -> ApiError:
    # RFC 6750: no error attribute when no credentials were sent at all.
    sent = code != ErrorCode.TOKEN_REQUIRED
    challenge = f'{CHALLENGE}, error="{code}"' if sent else CHALLENGE
    return ApiError(code, message, headers={"WWW-Authenticate": challenge})


# A ServiceError's message is written for the person who asked; its kind gives the code.
SERVICE_ERRORS: dict[type[services.ServiceError], ErrorCode] = {
    services.NotFound: ErrorCode.NOT_FOUND,
    services.InvalidInput: ErrorCode.INVALID_INPUT,
    services.StaleState: ErrorCode.STALE_STATE,
    services.Refused: ErrorCode.REFUSED,
}


def _service_code(exc: services.ServiceError) -> ErrorCode:
    if isinstance(exc, attached.ProtocolRefused):
        return ErrorCode(exc.code)
    if isinstance(exc, s.ProtocolVersion):
        return ErrorCode.UNSUPPORTED_PROTOCOL
    for kind, code in SERVICE_ERRORS.items():
        if isinstance(exc, kind):
            return code
    return ErrorCode.REFUSED  # a refusal we have no better word for: the request was understood


def _service_error(exc: services.ServiceError) -> ApiError:
    retry_after = getattr(exc, "retry_after", None)
    headers = {} if retry_after is None else {"Retry-After": str(math.ceil(retry_after))}
    return ApiError(_service_code(exc), str(exc), headers=headers)


@dataclass(frozen=True)
class ApiCall:
    """One authenticated API request: who (by token, or by session where allowed), with
    what body."""

    request: HttpRequest
    user: User
    token: ApiToken | None
    body: dict[str, Any]

    @property
    def credential(self) -> str:
        """How the caller proved who they are, for audit reasons."""
        if self.token is None:
            return "a signed-in session"
        return f"token {self.token.prefix}… ({self.token.name})"


Handler = Callable[..., HttpResponse]


@dataclass(frozen=True)
class Action:
    """What one HTTP method of an endpoint needs (a capability) and does (a handler)."""

    capability: Capability
    handler: Handler


def endpoint(
    *, get: Action | None = None, post: Action | None = None, session_may_read: bool = False
) -> openapi.Endpoint:
    """A view answering only the given methods, each after authentication and role checks.

    ``session_may_read``: a signed-in console session is accepted as well as a token, for
    what holds no data and changes nothing.
    """
    actions = {method: action for method, action in (("GET", get), ("POST", post)) if action}
    allowed = ", ".join(actions)

    # login_not_required: the token is the login, so the session middleware must not
    # redirect to the login page. csrf_exempt: no cookie authenticates a change here.
    @login_not_required
    @csrf_exempt
    @never_cache
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        action = actions.get(request.method or "")
        if action is None:
            return ApiError(
                ErrorCode.METHOD_NOT_ALLOWED,
                f"{request.method} is not allowed here; use {allowed}",
                headers={"Allow": allowed},
            ).response()
        try:
            user, token = _authenticate(request, session_may_read=session_may_read)
            if not can(user, action.capability):
                raise ApiError(
                    ErrorCode.PERMISSION_DENIED, f"this needs the {action.capability} permission"
                )
            body = _body(request) if request.method == "POST" else {}
            return action.handler(ApiCall(request, user, token, body), **kwargs)
        except ApiError as exc:
            return exc.response()
        except services.ServiceError as exc:
            return _service_error(exc).response()
        except Exception as exc:
            if database_outage(exc):
                # Not the console's bug, and the request may be sent again (a step with its
                # request_id is never carried out twice): a warning, and a 503.
                logger.warning(
                    "API %s %s: the database failed: %s", request.method, request.path, exc
                )
                return database_unavailable()
            # A client gets JSON even when we fail; the details go to the log, not to it.
            logger.exception("API %s %s failed", request.method, request.path)
            failed = ApiError(ErrorCode.INTERNAL_ERROR, "internal error; it has been logged")
            return failed.response()

    described = cast(openapi.Endpoint, view)
    described.permissions = {method: action.capability for method, action in actions.items()}
    described.session_may_read = session_may_read
    return described


def _authenticate(
    request: HttpRequest, *, session_may_read: bool
) -> tuple[User, ApiToken | None]:
    header = request.META.get("HTTP_AUTHORIZATION", "").strip()
    if not header:
        session_user = getattr(request, "user", AnonymousUser())
        if session_may_read and isinstance(session_user, User) and session_user.is_active:
            return session_user, None
        raise _unauthorized(
            ErrorCode.TOKEN_REQUIRED,
            "an API token is required: send Authorization: Bearer <token>",
        )
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise _unauthorized(
            ErrorCode.INVALID_REQUEST, "the Authorization header must be Bearer <token>"
        )
    try:
        token = api_token_authenticate(secret)
    except TokenRefused as exc:
        raise _unauthorized(ErrorCode.INVALID_TOKEN, str(exc)) from None
    # Whatever the session said, this request acts as the token's user.
    request.user = token.user
    return token.user, token


def _body(request: HttpRequest) -> dict[str, Any]:
    too_big = ApiError(
        ErrorCode.BODY_TOO_LARGE,
        f"the body is larger than {MAX_BODY_BYTES // 1024 // 1024} MiB",
    )
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(ErrorCode.INVALID_BODY, "Content-Length is not a number") from None
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
        # Its nesting is bounded before anything walks it (see console.records.inputs).
        value = load_json(raw, what="the body")
    except InputRefused as exc:
        raise ApiError(ErrorCode.INVALID_BODY, str(exc)) from None
    if not isinstance(value, dict):
        raise ApiError(
            ErrorCode.INVALID_BODY, "the body must be a JSON object, like {\"reason\": \"...\"}"
        )
    return value


def _operation_key(key: str) -> str:
    """``key`` from the path, or a 400 when no operation could have it (a well-formed key
    that names nothing is the service's 404)."""
    problem = key_problem(key)
    if problem is not None:
        raise ApiError(ErrorCode.INVALID_INPUT, problem)
    return key


def _query_int(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdecimal() or len(raw) > 18:
        raise ApiError(ErrorCode.INVALID_QUERY, f"{name} must be a whole number ≥ 0")
    return int(raw)


def _answer(shape: s.Shape, value: Any, *, status: int = 200) -> JsonResponse:
    return JsonResponse(shape.dump(value), status=status)


# -- endpoints ---------------------------------------------------------------------------------


def _task_list(call: ApiCall) -> HttpResponse:
    filters = selectors.TaskFilters.from_query(call.request.GET)
    if filters.errors:
        # The console drops a bad filter and says so; a program would silently get every
        # task instead of the ones it asked for, so it is refused here.
        message = "; ".join(f"{name}: {text}" for name, text in filters.errors.items())
        raise ApiError(ErrorCode.INVALID_QUERY, message, fields=filters.errors)
    number = _query_int(call.request, "page")
    if number == 0:
        raise ApiError(ErrorCode.INVALID_QUERY, "page numbers start at 1")
    return _answer(s.TASK_PAGE, selectors.task_page(filters, number or 1))


def _task_start(call: ApiCall) -> HttpResponse:
    fields = s.START_TASK.read(call.body)
    agent = fields["agent"].strip()
    if not agent:
        raise ApiError(ErrorCode.INVALID_INPUT, "agent is required")
    task = services.task_start(
        agent=agent,
        input=fields["input"],
        limits=fields["limits"],
        actor=call.user,
        reason=fields["reason"].strip() or f"started through the API with {call.credential}",
    )
    response = _answer(s.TASK_ANSWER, task, status=201)
    response["Location"] = reverse("api:task", args=[task.id])
    return response


def _task_detail(call: ApiCall, task_id: int) -> HttpResponse:
    after = _query_int(call.request, "after")
    before = _query_int(call.request, "before")
    if after is not None and before is not None:
        raise ApiError(ErrorCode.INVALID_QUERY, "ask for events after or before a seq, not both")
    detail = selectors.task_detail(task_id, before=before)
    if detail is None:
        raise ApiError(ErrorCode.NOT_FOUND, f"there is no task {task_id}")
    if after is None:
        view = s.TaskView(detail, detail.events, detail.last_seq)
    else:
        # A client following a live task asks only for what it has not seen yet.
        events = selectors.trace(task_id, after=after)
        last_seq = events[-1].seq if events else after
        view = s.TaskView(detail, events, last_seq, more=len(events) == selectors.TRACE_WINDOW)
    return _answer(s.TASK_VIEW, view)


def _task_stop(call: ApiCall, task_id: int) -> HttpResponse:
    fields = s.STOP_TASK.read(call.body)
    task = services.task_stop(task_id=task_id, actor=call.user, reason=fields["reason"])
    # 202: a running task only has the stop recorded; its driver ends it before its next
    # step, so the client should watch the task until it is terminal.
    return _answer(s.TASK_ANSWER, task, status=200 if task.is_terminal else 202)


def _task_resume(call: ApiCall, task_id: int) -> HttpResponse:
    fields = s.RESUME_TASK.read(call.body)
    task = services.task_approve_resumption(
        task_id=task_id, actor=call.user, reason=fields["reason"], grant=fields["grant"]
    )
    return _answer(s.TASK_ANSWER, task)


def _operation_list(call: ApiCall) -> HttpResponse:
    return _answer(s.OPERATION_LIST, selectors.reconciliation_queue())


def _operation_resolve(call: ApiCall, key: str) -> HttpResponse:
    key = _operation_key(key)
    fields = s.RESOLVE_OPERATION.read(call.body)
    if fields["committed"]:
        if fields["override"]:
            raise ApiError(ErrorCode.INVALID_INPUT, "an override only goes with committed: false")
        op = services.operation_mark_committed(
            key=key, actor=call.user, evidence=fields["evidence"], result=fields["result"]
        )
    else:
        if fields["result"] is not None:
            raise ApiError(ErrorCode.INVALID_INPUT, "a result only goes with committed: true")
        op = services.operation_mark_not_committed(
            key=key, actor=call.user, evidence=fields["evidence"], override=fields["override"]
        )
    return _answer(s.OPERATION_ANSWER, op)


def _approval_list(call: ApiCall) -> HttpResponse:
    sent = call.request.GET.get("state", "")
    state = sent.strip() if sent else ApprovalState.PENDING
    if state not in ApprovalState.values:  # whitespace alone too: it is not the empty value
        # Refused rather than dropped, as the task list's filters: a program asking for
        # one state must not silently get another.
        shown = sent if len(sent) <= 60 else f"{sent[:60]}…"
        why = f"unknown state {shown!r}; one of {', '.join(ApprovalState.values)}"
        raise ApiError(ErrorCode.INVALID_QUERY, f"state: {why}", fields={"state": why})
    return _answer(s.APPROVAL_LIST, selectors.approval_list(state))


def _approval_detail(call: ApiCall, approval_id: int) -> HttpResponse:
    found = selectors.approval(approval_id)
    if found is None:
        raise ApiError(ErrorCode.NOT_FOUND, f"there is no approval {approval_id}")
    return _answer(s.APPROVAL, found)


def _approval_approve(call: ApiCall, approval_id: int) -> HttpResponse:
    fields = s.APPROVE_CALL.read(call.body)
    answered = services.approval_approve(
        approval_id=approval_id, actor=call.user, reason=fields["reason"]
    )
    return _answered(answered.id)


def _approval_reject(call: ApiCall, approval_id: int) -> HttpResponse:
    fields = s.REJECT_CALL.read(call.body)
    answered = services.approval_reject(
        approval_id=approval_id,
        actor=call.user,
        reason=fields["reason"],
        resume=fields["on_reject"] == "resume",
    )
    return _answered(answered.id)


def _answered(approval_id: int) -> HttpResponse:
    # Read again: the answer moved its task too (queued for a new phase, or ended).
    found = selectors.approval(approval_id)
    if found is None:  # pragma: no cover - nothing is deleted
        raise ApiError(ErrorCode.NOT_FOUND, f"there is no approval {approval_id}")
    return _answer(s.APPROVAL_ANSWER, found)


def _attach(call: ApiCall) -> HttpResponse:
    fields = s.ATTACH_TASK.read(call.body)
    answer, created = attached.attached_start(
        actor=call.user,
        request_id=fields["request_id"],
        lease=fields["lease"],
        agent=fields["agent"].strip(),
        client=fields["client"].strip(),
        tools=fields["tools"] or {},
        approval=fields["approval"],
        input=fields["input"],
        limits=fields["limits"],
        reason=fields["reason"].strip() or f"attached through the API with {call.credential}",
        # A start asked again by a new process (another lease) is the same start.
        fingerprint=attached.body_hash({k: v for k, v in call.body.items() if k != "lease"}),
    )
    response = _answer(s.ATTACHED, answer, status=201 if created else 200)
    response["Location"] = reverse("api:attached-steps", args=[answer["task"]])
    return response


def _step(call: ApiCall, task_id: int) -> HttpResponse:
    fields = s.STEP.read(call.body)
    step = fields.pop("step")
    answer = attached.attached_step(
        actor=call.user,
        task_id=task_id,
        request_id=fields.pop("request_id"),
        lease=fields.pop("lease"),
        step=step,
        fields={name: value for name, value in fields.items() if value is not None},
        fingerprint=attached.body_hash(call.body),
    )
    return _answer(s.STEP_ANSWER, answer)


def _openapi_document(call: ApiCall) -> HttpResponse:
    return JsonResponse(openapi.document())


tasks = endpoint(
    get=Action(Capability.READ, _task_list), post=Action(Capability.START, _task_start)
)
task = endpoint(get=Action(Capability.READ, _task_detail))
task_stop = endpoint(post=Action(Capability.STOP, _task_stop))
task_resume = endpoint(post=Action(Capability.APPROVE, _task_resume))
operations = endpoint(get=Action(Capability.READ, _operation_list))
operation_resolve = endpoint(post=Action(Capability.RECONCILE, _operation_resolve))
approvals = endpoint(get=Action(Capability.READ, _approval_list))
approval = endpoint(get=Action(Capability.READ, _approval_detail))
# Approving a held call is approving that task's resumption: the approver's permission.
approval_approve = endpoint(post=Action(Capability.APPROVE, _approval_approve))
approval_reject = endpoint(post=Action(Capability.APPROVE, _approval_reject))
attach = endpoint(post=Action(Capability.DRIVE, _attach))
attached_steps = endpoint(post=Action(Capability.DRIVE, _step))
openapi_document = endpoint(get=Action(Capability.READ, _openapi_document), session_may_read=True)


@login_not_required
@csrf_exempt
@never_cache
def not_found(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    """Any other path under the API: a JSON 404, not the console's HTML page."""
    return ApiError(
        ErrorCode.UNKNOWN_ENDPOINT, f"there is no API endpoint at {request.path}"
    ).response()
