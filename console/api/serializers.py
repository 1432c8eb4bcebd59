"""What the JSON API shows of each resource, declared once.

Each :class:`Shape` lists its fields; a field names its JSON Schema and how to read its
value. The same declaration turns a task into JSON (:meth:`Shape.dump`) and describes that
JSON in the OpenAPI document (:meth:`Shape.schema`, used by :mod:`console.api.openapi`), so the
answer and its description cannot drift apart. A request body is declared the same way
(a :class:`Body`): its fields are read and checked by the declaration that
describes them. Errors have one shape too (:data:`ERROR`), with a machine-readable code
(:class:`ErrorCode`) that fixes its HTTP status.

A new resource is one ``Shape`` here; a new endpoint then needs a view in
:mod:`console.api.views` and an entry in :mod:`console.api.openapi`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from operator import attrgetter
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.urls import reverse

from console import selectors
from console.drivers.attached import PROTOCOL_STEPS, STEPS, ProtocolStep
from console.models import (
    STOP_REASONS,
    ApprovalState,
    Decision,
    EventKind,
    OnReject,
    OperationState,
    TaskState,
    TraceEvent,
)
from console.records.inputs import (
    KEPT_DEPTH,
    MAX_AGENT_CHARS,
    MAX_ANSWER_BYTES,
    MAX_DEPTH,
    MAX_LEASE_CHARS,
    MAX_NAME_CHARS,
    MAX_REQUEST_ID_CHARS,
    MAX_RESULT_BYTES,
    MAX_TEXT_CHARS,
    InputRefused,
    check_bounded,
    check_kept,
    text_problem,
    unstorable,
)
from console.selectors import TaskDetail
from console.services import AGENT_NAME, MAX_TOOLS, InvalidInput

Schema = dict[str, Any]
"""A JSON Schema (2020-12, the dialect of OpenAPI 3.1)."""

# -- the declarations --------------------------------------------------------------------------


def nullable(schema: Schema) -> Schema:
    """``schema`` or ``null``."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def one_of(values: Iterable[str]) -> Schema:
    """A string that is one of ``values``."""
    return {"type": "string", "enum": list(dict.fromkeys(values))}


STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
COUNT: Schema = {"type": "integer", "minimum": 0}
BOOLEAN: Schema = {"type": "boolean"}
TIME: Schema = {"type": "string", "format": "date-time"}
OBJECT: Schema = {"type": "object"}
USERNAME: Schema = nullable(STRING)


@dataclass(frozen=True, slots=True)
class Field:
    """One member of a JSON object: its name, schema and meaning, and how to read its value.

    In an answer (:class:`Shape`), ``value`` reads it from the resource; a field that is not
    ``required`` is left out when its value is None. In a request (:class:`Body`), ``value``
    turns the raw JSON value (None when absent) into what the view uses, or raises
    InvalidInput with a message the client can act on.
    """

    name: str
    schema: Schema
    description: str
    value: Callable[[Any], Any]
    required: bool = True
    # The shapes that ``schema`` refers to, so that the document can describe them too.
    shapes: tuple[Shape, ...] = ()


def attr(name: str, schema: Schema, description: str, *, path: str = "") -> Field:
    """A field read from the attribute ``path`` (by default ``name``) of the value."""
    return Field(name, schema, description, attrgetter(path or name))


def user_attr(name: str, description: str) -> Field:
    """A field showing the username of the user in attribute ``name`` (or null)."""

    def username(value: Any) -> str | None:
        user: User | None = getattr(value, name)
        return None if user is None else user.get_username()

    return Field(name, USERNAME, description, username)


@dataclass(frozen=True)
class Shape:
    """A JSON object the API answers with: its name in the document and its fields."""

    name: str
    description: str
    fields: tuple[Field, ...]

    def dump(self, value: Any) -> dict[str, Any]:
        """``value`` as this shape's JSON object (datetimes are left to the JSON encoder)."""
        out: dict[str, Any] = {}
        for member in self.fields:
            item = member.value(value)
            if item is None and not member.required:
                continue
            out[member.name] = item
        return out

    def schema(self) -> Schema:
        """The JSON Schema of what :meth:`dump` returns: no other field, none missing."""
        return _closed_object(self.description, self.fields)

    def ref(self) -> Schema:
        """A reference to this shape among the document's component schemas."""
        return {"$ref": f"#/components/schemas/{self.name}"}

    def extended(self, name: str, description: str, *fields: Field) -> Shape:
        """This shape with more fields, under another name."""
        return Shape(name, description, self.fields + fields)

    def field(
        self, name: str, description: str, get: Callable[[Any], Any], *,
        many: bool = False, or_null: bool = False,
    ) -> Field:
        """A field of another shape holding this one (a list of them with ``many``, or
        null with ``or_null``), read by ``get``."""
        if many:
            return Field(
                name, {"type": "array", "items": self.ref()}, description,
                lambda value: [self.dump(item) for item in get(value)], shapes=(self,),
            )

        def one(value: Any) -> dict[str, Any] | None:
            item = get(value)
            return None if item is None else self.dump(item)

        schema = nullable(self.ref()) if or_null else self.ref()
        return Field(name, schema, description, one, shapes=(self,))


def shapes_below(roots: Iterable[Shape]) -> dict[str, Shape]:
    """``roots`` and every shape their fields refer to, by name."""
    found: dict[str, Shape] = {}
    todo = list(roots)
    while todo:
        shape = todo.pop()
        if shape.name in found:
            continue
        found[shape.name] = shape
        todo.extend(s for m in shape.fields for s in m.shapes)
    return found


# Text the database can hold has no NUL (the other thing it cannot hold, a lone surrogate,
# is no character a JSON Schema pattern can name); required text also has a character that
# is not whitespace, since the service trims it first. Python trims \x1c-\x1f and \x85 too,
# which a JSON Schema (ECMA-262) \s does not name.
_STORABLE_TEXT = "^[^\\u0000]*$"
_SOME_TEXT = "^[^\\u0000]*[^\\s\\u0000\\u001c-\\u001f\\u0085][^\\u0000]*$"


def text_input(name: str, description: str, *, required: bool = False) -> Field:
    """A string; absent or null reads as ``""`` (the service says if it may be empty). A
    ``required`` one is described as a string with something in it besides whitespace, the
    service's rule: null, empty or blank is a 400."""

    def read(value: Any) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise InvalidInput(f"{name} must be a string")
        problem = text_problem(value)
        if problem is not None:
            raise InvalidInput(f"{name} {problem}")
        return value

    if required:
        schema: Schema = {"type": "string", "pattern": _SOME_TEXT}
    else:
        schema = {"type": ["string", "null"], "pattern": _STORABLE_TEXT}
    return Field(name, schema, description, read, required)


def object_input(name: str, description: str, *, kept: bool = False) -> Field:
    """A JSON object; absent or null reads as None. ``kept``: it is stored and handed to an
    agent, so it must nest no deeper than the redaction keeps whole
    (:data:`console.records.inputs.KEPT_DEPTH`)."""

    def read(value: Any) -> dict[str, Any] | None:
        if value is not None and not isinstance(value, dict):
            raise InvalidInput(f"{name} must be a JSON object")
        _storable(name, value, kept=kept)
        return value

    return Field(name, nullable(OBJECT), description, read, required=False)


def flag_input(name: str, description: str, *, means: tuple[str, str]) -> Field:
    """``true`` or ``false``, required: ``means`` says what each one says."""

    def read(value: Any) -> bool:
        if not isinstance(value, bool):
            raise InvalidInput(f"{name} must be true ({means[0]}) or false ({means[1]})")
        return value

    return Field(name, BOOLEAN, description, read)


def choice_input(name: str, values: Sequence[str], description: str) -> Field:
    """One of ``values``, required."""

    def read(value: Any) -> str:
        if not isinstance(value, str) or value not in values:
            raise InvalidInput(f"{name} must be one of: {', '.join(values)}")
        return value

    return Field(name, one_of(values), description, read)


def any_input(
    name: str, description: str, *, kept: bool = False, most_bytes: int | None = None
) -> Field:
    """Any JSON value, taken as it is (``kept``: as for :func:`object_input`; with
    ``most_bytes`` also at most that large as JSON,
    :func:`console.records.inputs.check_bounded`)."""

    def read(value: Any) -> Any:
        _storable(name, value, kept=kept or most_bytes is not None)
        if most_bytes is not None and value is not None:
            try:
                check_bounded(value, what=name, most_bytes=most_bytes)
            except InputRefused as exc:
                raise InvalidInput(str(exc)) from None
        return value

    return Field(name, {}, description, read, required=False)


def _storable(name: str, value: Any, *, kept: bool) -> None:
    """Refuse what the database cannot hold, and with ``kept`` what the redaction would cut,
    before a service stores something other than what was sent."""
    try:
        if kept:
            check_kept(value, what=name)
    except InputRefused as exc:
        raise InvalidInput(str(exc)) from None
    problem = unstorable(value, what=name)
    if problem is not None:
        raise InvalidInput(problem)


def label_input(name: str, description: str) -> Field:
    """A name shown with what it names (a client), required: 1 to
    :data:`console.records.inputs.MAX_NAME_CHARS` printable characters, refused rather than cut (a
    cut name would name something else)."""

    def read(value: Any) -> str:
        if (
            not isinstance(value, str)
            or not 0 < len(value.strip()) <= MAX_NAME_CHARS
            or not value.isprintable()
        ):
            raise InvalidInput(f"{name} must be 1 to {MAX_NAME_CHARS} printable characters")
        return value

    schema = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}
    return Field(name, schema, description, read)


@dataclass(frozen=True)
class Body:
    """A request body: a JSON object of these fields and no others."""

    name: str
    description: str
    fields: tuple[Field, ...]

    def read(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Each declared field's value, read and checked; an unknown field is refused, so
        that a typo (``"reasn"``) does not pass silently."""
        known = [f.name for f in self.fields]
        unknown = sorted(set(body) - set(known))
        if unknown:
            raise InvalidInput(
                f"unknown field(s): {', '.join(unknown)}; expected: {', '.join(known)}"
            )
        return {f.name: f.value(body.get(f.name)) for f in self.fields}

    def schema(self) -> Schema:
        """The JSON Schema of the bodies :meth:`read` accepts the fields of."""
        return _closed_object(self.description, self.fields)


def _closed_object(description: str, members: Sequence[Field]) -> Schema:
    """An object of these members and no others."""
    return {
        "type": "object",
        "description": description,
        "properties": {m.name: {**m.schema, "description": m.description} for m in members},
        "required": [m.name for m in members if m.required],
        "additionalProperties": False,
    }


# -- errors ------------------------------------------------------------------------------------


class ErrorCode(StrEnum):
    """What went wrong, for a program: every error answer carries one, and each code has
    one HTTP status (:attr:`status`)."""

    INVALID_BODY = "invalid_body"
    INVALID_INPUT = "invalid_input"
    INVALID_QUERY = "invalid_query"
    TOKEN_REQUIRED = "token_required"  # noqa: S105 (a code, not a secret)
    INVALID_REQUEST = "invalid_request"
    INVALID_TOKEN = "invalid_token"  # noqa: S105 (RFC 6750's code)
    PERMISSION_DENIED = "permission_denied"
    NOT_FOUND = "not_found"
    UNKNOWN_ENDPOINT = "unknown_endpoint"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    STALE_STATE = "stale_state"
    REFUSED = "refused"
    BODY_TOO_LARGE = "body_too_large"
    INTERNAL_ERROR = "internal_error"
    DATABASE_UNAVAILABLE = "database_unavailable"
    # The step protocol's own (docs/protocol.md).
    UNSUPPORTED_PROTOCOL = "unsupported_protocol"
    NOT_ATTACHED = "not_attached"
    LEASE_HELD = "lease_held"
    REQUEST_ID_REUSED = "request_id_reused"
    STEP_OUT_OF_ORDER = "step_out_of_order"
    UNKNOWN_CALL = "unknown_call"
    CALL_NOT_ALLOWED = "call_not_allowed"
    RESULT_GIVEN = "result_given"

    @property
    def status(self) -> int:
        """The HTTP status every answer with this code has."""
        return _ERRORS[self][0]

    @property
    def meaning(self) -> str:
        """What the code means, for the document."""
        return _ERRORS[self][1]


_ERRORS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_BODY: (
        400, f"the body is not a JSON object: not JSON, nested more than {MAX_DEPTH} levels deep, "
        "holding NaN or Infinity (or Content-Length is not a number)",
    ),
    ErrorCode.INVALID_INPUT: (
        400, "a field is unknown, missing, of the wrong type, holds text that cannot be "
        "stored (a NUL character, a lone surrogate), or is refused by the console; or the "
        "operation key in the path is malformed",
    ),
    ErrorCode.INVALID_QUERY: (
        400, "a query parameter is malformed (`fields` names each bad filter)",
    ),
    ErrorCode.TOKEN_REQUIRED: (401, "no credentials were sent"),
    ErrorCode.INVALID_REQUEST: (401, "the Authorization header is not `Bearer <token>`"),
    ErrorCode.INVALID_TOKEN: (401, "the token is unknown or revoked, or its user is deactivated"),
    ErrorCode.PERMISSION_DENIED: (403, "the token's user lacks the role this needs"),
    ErrorCode.NOT_FOUND: (404, "there is no such task, operation or approval"),
    ErrorCode.UNKNOWN_ENDPOINT: (
        404, "no endpoint has this path (an id in it that is not a whole number ≥ 0, like -1 "
        "or abc, makes such a path too)",
    ),
    ErrorCode.METHOD_NOT_ALLOWED: (405, "the endpoint does not answer this method (see `Allow`)"),
    ErrorCode.STALE_STATE: (
        409, "the task, operation or approval is no longer in the state the action was meant "
        "for (someone acted first)",
    ),
    ErrorCode.REFUSED: (409, "the action is not allowed now; the message says why"),
    ErrorCode.BODY_TOO_LARGE: (413, "the body is larger than 1 MiB"),
    ErrorCode.INTERNAL_ERROR: (500, "the console failed; the details are in its log"),
    ErrorCode.DATABASE_UNAVAILABLE: (
        503, "the console's database could not be reached, or the connection to it was lost "
        "during the request (a restart, a failover), so a change may or may not have been "
        "made: send the same request again after `Retry-After` seconds (a step with the same "
        "`request_id`, which the console never carries out twice)",
    ),
    ErrorCode.UNSUPPORTED_PROTOCOL: (
        400, "protocol is missing or not a version this console speaks",
    ),
    ErrorCode.NOT_ATTACHED: (409, "the task is hosted: the console's workers drive it"),
    ErrorCode.LEASE_HELD: (409, "another client's lease drives the task"),
    ErrorCode.REQUEST_ID_REUSED: (
        409, "this request_id was used for another request (another body) of the task",
    ),
    ErrorCode.STEP_OUT_OF_ORDER: (
        409, "the step does not fit where the task is (tools without a model step, a model "
        "step while a call's result is unreported, a call decided already)",
    ),
    ErrorCode.UNKNOWN_CALL: (409, "no call of the current model call has this ticket"),
    ErrorCode.CALL_NOT_ALLOWED: (409, "a result for a call the guard never let run"),
    ErrorCode.RESULT_GIVEN: (409, "a second result for one call"),
}

ERROR = Shape("Error", "Every failure: a message for people and a code for programs.", (
    attr("error", STRING, "what went wrong, for the person who asked", path="message"),
    attr("code", one_of(ErrorCode), "what went wrong, for a program"),
    Field(
        "fields", {"type": "object", "additionalProperties": STRING},
        "with `invalid_query`: what is wrong with each filter, by name", attrgetter("fields"),
        required=False,
    ),
))


# -- resources ---------------------------------------------------------------------------------

TASK_STATE = one_of(TaskState.values)
STOP_REASON = one_of(["", *STOP_REASONS])
EITHER_STATE = one_of(["", *TaskState.values])

COUNTERS = Shape("Counters", "What the task has spent so far, across all its phases.", tuple(
    attr(name, COUNT, f"{name} spent") for name in selectors.BUDGETS
))

TASK = Shape("Task", "A task as the list and the actions show it.", (
    attr("id", INTEGER, "the task's id"),
    Field("url", STRING, "where the API shows it", lambda t: reverse("api:task", args=[t.id])),
    attr("agent", STRING, "the agent that runs it"),
    Field(
        "client", nullable(STRING),
        "what drives it when it is attached (its own process, over the step protocol); "
        "null for a task the console's workers run",
        lambda t: t.client or None,
    ),
    attr("state", TASK_STATE, "where it is: queued, running, or how it ended"),
    attr("reason", STOP_REASON, "why it stopped (empty while it has not)"),
    attr("detail", STRING, "more about the stop, for people"),
    attr("phase", COUNT, "its current phase: 1, then one more per approved resumption"),
    attr("created_at", TIME, "when it was started"),
    attr("updated_at", TIME, "when it last changed"),
    attr("finished_at", nullable(TIME), "when it last stopped"),
    attr("stop_requested_at", nullable(TIME), "when someone asked it to stop"),
    COUNTERS.field("counters", "what it spent, cumulative across phases", lambda t: t),
    attr("revision", INTEGER, "the verified business progress its inspector reported"),
    attr("limits", OBJECT, "its budgets (guard.Limits' fields), with every grant added"),
))

TASK_DETAIL = TASK.extended(
    "TaskDetail", "A task with what only its own page shows.",
    attr("input", OBJECT, "what it was started with, redacted"),
    user_attr("created_by", "who started it (null: from the shell)"),
    user_attr("stop_requested_by", "who asked it to stop"),
    attr("stop_note", STRING, "the reason they gave"),
)

GAUGE = Shape("Gauge", "One budget: spent / limit across all phases.", (
    attr("name", one_of(selectors.BUDGETS), "the budget"),
    attr("used", COUNT, "spent so far"),
    attr("limit", nullable(COUNT), "the limit (null: unbounded)"),
    attr("percent", COUNT, "used as a percentage of limit, at most 100"),
    attr("level", one_of(["ok", "warn", "out"]), "ok below 80 %, warn from 80 %, out at 100 %"),
))

OPERATION = Shape("Operation", "A ledger operation, without its stored result.", (
    attr("key", STRING, "the operation key naming the business action"),
    Field(
        "resolve_url", STRING, "where to settle it",
        lambda op: reverse("api:operation-resolve", kwargs={"key": op.key}),
    ),
    attr("task", INTEGER, "the task that claimed it last", path="task_id"),
    attr("state", one_of(OperationState.values), "whether it happened, as far as is known"),
    attr("tool", STRING, "the write tool"),
    attr("args_preview", STRING, "its arguments, redacted and shortened"),
    attr("attempts", COUNT, "how many times it was claimed"),
    attr("evidence", STRING, "what settled it, as the reconciler wrote it"),
    attr("claimed_at", TIME, "when it was first claimed"),
    attr("updated_at", TIME, "when its state last changed"),
))

PHASE = Shape("Phase", "One stretch of execution: the first start, then each resumption.", (
    attr("number", COUNT, "1 for the first start"),
    attr("state", EITHER_STATE, "how it ended (empty while it has not)"),
    attr("reason", STOP_REASON, "why it ended (empty while it has not)"),
    attr("started_at", nullable(TIME), "when a worker first drove it"),
    attr("ended_at", nullable(TIME), "when it stopped"),
    user_attr("approved_by", "who approved it (null for the first phase)"),
    attr("approval_note", STRING, "the reason they gave"),
    attr("grant", OBJECT, "the budget added for it, by limit"),
    attr("usage_at_start", OBJECT, "what the task had spent when it began"),
))

STOP_REPORT = Shape("StopReport", "The guard's report at the end of a phase.", (
    attr("phase", COUNT, "the phase it ended"),
    attr("at", TIME, "when"),
    attr("state", TASK_STATE, "the terminal state"),
    attr("reason", STOP_REASON, "why"),
    attr("report", OBJECT, "the full stop report: done, why, uncertain operations, budget left"),
))

TRACE_EVENT = Shape("TraceEvent", "One model call, tool request, wait or stop, redacted.", (
    attr("seq", COUNT, "its place in the task's trace, from 1"),
    attr("phase", COUNT, "the phase it belongs to"),
    attr("at", TIME, "when"),
    attr("kind", one_of(EventKind.values), "what happened"),
    attr("decision", one_of(["", *Decision.values]), "what the guard decided"),
    attr("reason", STRING, "the guard's reason, when it blocked or stopped"),
    attr("tool", STRING, "the tool requested"),
    attr("fingerprint", STRING, "hash of the tool and its canonical arguments"),
    attr("args_preview", STRING, "its arguments, redacted and shortened"),
    attr("result_kind", STRING, "SUCCESS, RETRYABLE, PENDING, PRECONDITION or FATAL"),
    attr("result_preview", STRING, "its result, redacted and shortened"),
    attr("revision", nullable(INTEGER), "the revision inspect reported after it"),
    attr("operation_key", STRING, "the operation key of a write"),
    attr("latency_ms", nullable(COUNT), "how long it took"),
    attr("tokens", nullable(COUNT), "model tokens it used"),
    attr("detail", STRING, "more, for people"),
))

PAGE = Shape("Page", "Where a page of a list stands.", (
    attr("number", COUNT, "this page, from 1"),
    attr("pages", COUNT, "how many pages there are", path="paginator.num_pages"),
    attr("per_page", COUNT, "tasks per page", path="paginator.per_page"),
    attr("count", COUNT, "tasks matching, on all pages", path="paginator.count"),
    Field("next", nullable(COUNT), "the next page's number", lambda page: (
        page.next_page_number() if page.has_next() else None
    )),
    Field("previous", nullable(COUNT), "the previous page's number", lambda page: (
        page.previous_page_number() if page.has_previous() else None
    )),
))


@dataclass(frozen=True)
class TaskView:
    """What ``GET /api/tasks/<id>`` shows: a task's detail and one window of its trace."""

    detail: TaskDetail
    events: Sequence[TraceEvent]
    last_seq: int
    # The window is full and follows ``after``: there may be newer events.
    more: bool = False


TASK_PAGE = Shape("TaskPage", "One page of the task list, newest first.", (
    TASK.field("tasks", "the tasks on this page", list, many=True),
    PAGE.field("page", "where this page stands", lambda page: page),
))

TASK_ANSWER = Shape("TaskAnswer", "A task, as an action left it.", (
    TASK.field("task", "the task", lambda task: task),
))

TASK_VIEW = Shape("TaskView", "A task, its gauges, operations, phases, stop report and trace.", (
    TASK_DETAIL.field("task", "the task", lambda v: v.detail.task),
    GAUGE.field("gauges", "its budgets", lambda v: v.detail.gauges, many=True),
    OPERATION.field(
        "operations", "its ledger operations", lambda v: v.detail.operations, many=True
    ),
    PHASE.field("phases", "its phases, first first", lambda v: v.detail.phases, many=True),
    STOP_REPORT.field(
        "stop_report", "its latest stop report (null: it never stopped)",
        lambda v: v.detail.reports[0] if v.detail.reports else None, or_null=True,
    ),
    TRACE_EVENT.field("events", "one window of its trace, in order", lambda v: v.events, many=True),
    attr("last_seq", COUNT, "the last seq shown: ask again with ?after=last_seq for newer"),
    Field(
        "earlier", BOOLEAN, "older events exist: page back with ?before=<first seq>",
        lambda v: bool(v.events) and v.events[0].seq > 1,
    ),
    attr("more", BOOLEAN, "the window after ?after= is full: there may be newer events"),
))

OPERATION_LIST = Shape("OperationList", "The reconciliation queue, oldest first.", (
    OPERATION.field(
        "operations", "writes whose commit state a person must settle", list, many=True
    ),
))

OPERATION_ANSWER = Shape("OperationAnswer", "An operation, as an action left it.", (
    OPERATION.field("operation", "the operation", lambda op: op),
))


APPROVAL = Shape("Approval", "One call held for a person's approval, and its answer.", (
    attr("id", INTEGER, "the approval's id"),
    Field(
        "url", STRING, "where the API shows it",
        lambda a: reverse("api:approval", args=[a.id]),
    ),
    attr("task", INTEGER, "the task that holds the call", path="task_id"),
    Field("agent", STRING, "the task's agent", lambda a: a.task.agent),
    attr("phase", COUNT, "the phase that stopped for this call"),
    attr("tool", STRING, "the tool the call is to"),
    attr("effect", one_of(["read", "write"]), "whether the call reads or writes"),
    attr("operation_key", STRING, "the operation key of a write (empty for a read)"),
    attr("fingerprint", STRING, "hash of the tool and its canonical arguments"),
    attr("args", OBJECT, "the call's arguments in full, redacted"),
    attr("state", one_of(ApprovalState.values), "PENDING until a person answers"),
    attr("requested_at", TIME, "when the task stopped for it"),
    user_attr("decided_by", "who answered it (null while it is pending)"),
    attr("decided_at", nullable(TIME), "when it was answered"),
    attr("reason", STRING, "the reason they gave"),
    attr(
        "on_reject", one_of(["", *OnReject.values]),
        "for a rejection: resume (the model was told) or end (the task ended)",
    ),
    Field(
        "approve_url", STRING, "where to approve it",
        lambda a: reverse("api:approval-approve", args=[a.id]),
    ),
    Field(
        "reject_url", STRING, "where to reject it",
        lambda a: reverse("api:approval-reject", args=[a.id]),
    ),
))


APPROVAL_LIST = Shape("ApprovalList", "Approvals in one state.", (
    APPROVAL.field(
        "approvals", f"pending ones oldest first, answered ones the latest answer first; "
        f"at most {selectors.APPROVALS_SHOWN}", list, many=True,
    ),
))

APPROVAL_ANSWER = Shape("ApprovalAnswer", "An approval as its answer left it, and its task.", (
    APPROVAL.field("approval", "the approval", lambda a: a),
    TASK.field("task", "its task: QUEUED for a new phase, or PARTIAL when it ended",
               lambda a: a.task),
))


# -- request bodies ----------------------------------------------------------------------------

START_TASK = Body("StartTask", "A task to start.", (
    replace(
        text_input("agent", "the agent to run: one the console offers", required=True),
        schema=one_of(settings.LOOPGUARD_AGENTS),
    ),
    object_input(
        "input", f"the agent's input, checked by the agent; at most {KEPT_DEPTH} levels deep",
        kept=True,
    ),
    object_input("limits", "budgets to use instead of the defaults (guard.Limits' fields)"),
    text_input(
        "reason", f"why, for the audit log: optional, at most {MAX_TEXT_CHARS:,} characters; "
        "when empty the audit entry names the token",
    ),
))

def _reasoned(name: str, description: str, *more: Field, why: str = "") -> Body:
    """A person's action: why they take it (required, for the audit log), and ``more``."""
    reason = f"why, for the audit log{why} (required)"
    return Body(name, description, (text_input("reason", reason, required=True), *more))


STOP_TASK = _reasoned("StopTask", "Why the task must stop.")
RESUME_TASK = _reasoned("ResumeTask", "An approval of a new phase.", object_input(
    "grant", "budget to add, by limit, e.g. {\"model_calls\": 5}; required when a budget ran out",
))
APPROVE_CALL = _reasoned("ApproveCall", "A yes to the held call.")
REJECT_CALL = _reasoned("RejectCall", "A no to the held call.", choice_input(
    "on_reject", OnReject.values,
    "resume: the task goes on and its model is told the call was refused and why; "
    "end: the task ends PARTIAL/approval_rejected (required)",
), why=" and for the model")

RESOLVE_OPERATION = Body("ResolveOperation", "What the business system shows.", (
    flag_input(
        "committed", "true: it happened; false: it did not",
        means=("it happened", "it did not"),
    ),
    text_input("evidence", "what was checked, for the audit log (required)", required=True),
    any_input(
        "result", "with committed: true, the tool's data (any JSON value): what the agent "
        "is given as the result's data when it asks for this write again, stored as a "
        "SUCCESS result's data. Not a whole result: a mapping shaped like one (kind one of "
        "the result kinds, beside at most data, wait_ms and attempts) would be handed over "
        "wrapped twice, so it is refused (400 invalid_input); at most "
        f"{KEPT_DEPTH} levels deep and {MAX_RESULT_BYTES // 1024} KiB as JSON",
        most_bytes=MAX_RESULT_BYTES,
    ),
    text_input(
        "override", "with committed: false, why the person knows better than the tool's "
        "lookup when it finds the action (without one, that is refused: 409 refused)",
    ),
))


# -- the step protocol of attached tasks (docs/protocol.md) -------------------------------------


def _member(name: str, schema: Schema, description: str, *, required: bool = False) -> Field:
    """A field of an answer built as a mapping (the step protocol's answers)."""
    return Field(name, schema, description, lambda answer: answer.get(name), required)


def _printable_id(name: str, description: str) -> Field:
    """1 to :data:`~console.records.inputs.MAX_REQUEST_ID_CHARS` (a lease:
    :data:`~console.records.inputs.MAX_LEASE_CHARS`) printable ASCII characters, required."""
    longest = MAX_LEASE_CHARS if name == "lease" else MAX_REQUEST_ID_CHARS

    def read(value: Any) -> str:
        if (
            not isinstance(value, str)
            or not 0 < len(value) <= longest
            or not (value.isascii() and value.isprintable())
        ):
            raise InvalidInput(f"{name} must be 1 to {longest} printable ASCII characters")
        return value

    # Printable ASCII is the space to the tilde.
    schema = {"type": "string", "minLength": 1, "maxLength": longest, "pattern": "^[ -~]+$"}
    return Field(name, schema, description, read)


def _protocol_version(value: Any) -> int:
    # The integer 1 only: in Python 1.0 and True are equal to 1, yet neither is the version.
    if type(value) is not int or value != 1:
        raise ProtocolVersion(
            "protocol must be 1: this console speaks version 1 of the step protocol"
        )
    return 1


class ProtocolVersion(InvalidInput):
    """The request speaks a version of the step protocol this console does not."""


def _by_name(*fields: Field) -> dict[str, Field]:
    return {field.name: field for field in fields}


def _steps_named(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _taken_by_steps(
    fields: Mapping[str, Field], named: Callable[[ProtocolStep], tuple[str, ...]]
) -> list[Field]:
    """``fields`` in their order, each said of the steps that take (or give) it, as the
    table of steps has it; a field no step names is left out, a name with no field fails
    here, at import."""
    steps: dict[str, list[str]] = {}
    for step in PROTOCOL_STEPS.values():
        for name in named(step):
            if name not in fields:
                raise LookupError(f"step {step.name} names {name!r}, which is not declared")
            steps.setdefault(name, []).append(step.name)
    return [
        replace(field, description=f"{', '.join(steps[name])}: {field.description}")
        for name, field in fields.items()
        if name in steps
    ]


_PROTOCOL = Field(
    "protocol", {"type": "integer", "const": 1}, "the protocol's version: 1", _protocol_version
)
_REQUEST_ID = _printable_id(
    "request_id",
    "unique per request of the task; a retry sends the same one and gets the same answer",
)
_LEASE = _printable_id("lease", "who drives the task: one value per client process")

ATTACH_TASK = Body("AttachTask", "An attached task to create, driven by the caller.", (
    _PROTOCOL, _REQUEST_ID, _LEASE,
    replace(
        text_input(
            "agent", f"what the agent is called on the console's pages: 1 to {MAX_AGENT_CHARS} "
            "letters, digits, dots, underscores or hyphens (whitespace around them is trimmed)",
            required=True,
        ),
        schema={"type": "string", "pattern": f"^\\s*{AGENT_NAME}\\s*$"},
    ),
    label_input(
        "client",
        f"what drives it, shown with the task (e.g. langchain/1.2): 1 to {MAX_NAME_CHARS} "
        "printable characters",
    ),
    replace(
        object_input(
            "tools", 'every tool the agent may call: name -> "read" or "write" (required; a '
            f"name is 1 to {MAX_NAME_CHARS} printable characters, at most {MAX_TOOLS} tools)",
        ),
        schema={
            "type": "object", "minProperties": 1, "maxProperties": MAX_TOOLS,
            "propertyNames": {"minLength": 1, "maxLength": MAX_NAME_CHARS},
            "additionalProperties": one_of(["read", "write"]),
        },
        required=True,
    ),
    replace(
        any_input(
            "approval",
            "the names of declared tools whose every call waits for a person's approval "
            "before it runs (optional; each one of tools)",
        ),
        schema=nullable({"type": "array", "items": STRING}),
    ),
    object_input(
        "input", f"the task's goal, stored redacted; at most {KEPT_DEPTH} levels deep", kept=True
    ),
    object_input("limits", "budgets to use instead of the defaults (guard.Limits' fields)"),
    text_input(
        "reason", f"why, for the audit log (optional, at most {MAX_TEXT_CHARS:,} characters)"
    ),
))

# Each field a step takes (console.drivers.attached.PROTOCOL_STEPS says which steps take it; its
# description is prefixed with their names).
_STEP_FIELDS = _by_name(
    any_input("reserve", "the model call's maximum cost, reserved before it starts"),
    any_input("calls", "the model call's calls, [{tool, args, effect?, operation_key?}]"),
    any_input(
        "enter", "with exactly one call: the client runs it as soon as it hears, so the "
        "answer decides its entry too (action, result), as a call step would",
    ),
    any_input("ticket", "the number of an admitted call"),
    any_input(
        "result", "what the tool returned, {kind, data?, wait_ms?, attempts?}; at most "
        f"{KEPT_DEPTH} levels deep and {MAX_RESULT_BYTES // 1024} KiB as JSON",
        most_bytes=MAX_RESULT_BYTES,
    ),
    any_input(
        "error", "what the tool raised instead, {type, message, transient}; for failed, why "
        "the model call failed, a string",
    ),
    any_input(
        "lookup", "for a call a lost client left running (interrupted): what the tool's "
        "trusted lookup by operation key found, {committed: true|false|null, result?, "
        "evidence}",
    ),
    any_input("evidence", "the client's inspector's word, {revision, done, committed}"),
    any_input(
        "then", 'with the last result of a model call, "wait" (answer the wait too) or '
        '"model" (and, when there is none, allow the next model call, reserving reserve)',
    ),
    any_input(
        "answer", f"the model's answer; at most {KEPT_DEPTH} levels deep and "
        f"{MAX_ANSWER_BYTES // 1024} KiB as JSON",
        most_bytes=MAX_ANSWER_BYTES,
    ),
    any_input("state", "the terminal state"),
    any_input("reason", "the reason, in the guard's words"),
    any_input("detail", "more about it"),
)

STEP = Body("Step", "One step of an attached task (docs/protocol.md: each step's fields).", (
    _PROTOCOL, _REQUEST_ID, _LEASE,
    Field(
        "step", {"type": "string", "enum": list(STEPS)}, f"one of {_steps_named(STEPS)}",
        text_input("step", "").value,
    ),
    object_input("usage", "what the model call since the last step spent: {tokens, cost}"),
    *_taken_by_steps(_STEP_FIELDS, lambda step: step.takes),
))

_REMAINING = {"type": "object", "additionalProperties": nullable(INTEGER)}
_STEP_COMMON = (
    _member("protocol", {"type": "integer", "const": 1}, "the protocol's version", required=True),
    _member("task", INTEGER, "the task's id", required=True),
    _member("phase", COUNT, "its current phase", required=True),
    _member("state", TASK_STATE, "where it is now", required=True),
    _member("remaining", _REMAINING, "budget left per dimension (null: no limit)", required=True),
    _member(
        "stop", nullable(OBJECT),
        "the full stop report once the task has stopped (the same on every later step)",
        required=True,
    ),
)

ATTACHED = Shape("AttachedTask", "An attached task as its start left it.", (
    *_STEP_COMMON,
    _member("lease_seconds", {"type": "number"}, "how long each step's lease lasts", required=True),
    _member("url", STRING, "the task's page on the console", required=True),
    _member(
        "attach", BOOLEAN,
        "true when this start was made before by another lease (a new process asking again "
        "with the same request_id): the task exists; take it over with a heartbeat step",
    ),
))

# Each field an answer may give beyond every step's own, prefixed like the request's.
_ANSWER_FIELDS = _by_name(
    _member("allowed", BOOLEAN, "the next model call may start"),
    _member("admitted", {"type": "array", "items": OBJECT}, "the tickets of the admitted calls"),
    _member("nudge", OBJECT, "nothing runs; show this message to the model"),
    _member(
        "action", one_of(["execute", "reuse"]),
        "run the tool once, or reuse result (tools: with enter)",
    ),
    _member("result", nullable(OBJECT), "the stored result, with reuse"),
    _member("wait_ms", {"type": "number"}, "milliseconds to wait before the next model call"),
    _member("stop_requested", BOOLEAN, "an operator asked the task to stop"),
    _member("lease_seconds", {"type": "number"}, "how long the lease now lasts"),
    _member(
        "interrupted", {"type": "array", "items": OBJECT},
        "after another client (or this one, once its lease ran out) left calls running: each "
        "call's ticket, tool, effect, operation_key and status, to report with a result step "
        "(a lookup's answer for a write, or nothing: lost)",
    ),
)

STEP_ANSWER = Shape("StepAnswer", "What one step decided (docs/protocol.md).", (
    *_STEP_COMMON,
    _member("request_id", STRING, "the request this answers", required=True),
    *_taken_by_steps(_ANSWER_FIELDS, lambda step: step.gives),
))
