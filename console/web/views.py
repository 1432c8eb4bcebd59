"""The console's pages. Each view checks access, calls one selector or service, renders.

A page and its htmx fragments come from the same template (``page.html#partial``).
Every action is a POST with CSRF; a stale action (someone else acted first) comes back as
a clear message, never as a second action or a server error.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from functools import wraps
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import User
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseBase,
    JsonResponse,
    QueryDict,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRefresh, HttpResponseStopPolling

from console import selectors, services
from console.models import STOP_REASONS, AuditAction, TaskState
from console.records.inputs import key_problem
from console.records.roles import Capability, can, capabilities_of
from console.web import health
from console.web.forms import ApprovalForm, BulkForm, ResolveForm, ResumeForm, StartForm, StopForm

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
    context.setdefault("can", _can(request))
    return render(request, template, context)


def _list(
    request: HttpRequest,
    template: str,
    filters: selectors.TaskFilters | selectors.AuditFilters,
    page: selectors.ListPage[Any],
    choices: Mapping[str, Any],
) -> HttpResponse:
    """A filtered list: the whole page, or only its ``results`` when htmx filters it or
    polls it (:func:`_unchanged`); ``choices`` are what its filter form offers."""
    context = {
        "filters": filters,
        "query": filters.as_query(),
        "page": page,
        "version": VERSION_MARK,
        **choices,
    }
    return _unchanged(request, _page(request, template, context, frozenset({"results"})))


VERSION_MARK = "0-version-of-this-region-0"
"""Where a live region's poll URL carries the version of what it shows (see ``_unchanged``)."""


def _unchanged(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """A live region polls with the version of what it shows (``?v=``, a hash of the
    region as last rendered): unchanged since, the answer is a 204 without a body, which
    htmx leaves as it is; changed, the region comes back with its new version. A whole
    page carries no version, so its first poll always brings the region once."""
    htmx = getattr(request, "htmx", None)
    content = response.content.decode()
    if not htmx or response.status_code != 200 or VERSION_MARK not in content:
        response.content = content.replace(VERSION_MARK, "").encode()
        return response
    version = hashlib.sha256(content.encode()).hexdigest()[:16]
    if request.GET.get("v") == version:
        return HttpResponse(status=204)
    response.content = content.replace(VERSION_MARK, version).encode()
    return response


def _can(request: HttpRequest) -> dict[str, bool]:
    """What the person may do, for templates to offer: ``{% if can.stop %}``."""
    return {cap.value: True for cap in capabilities_of(request.user)}


def _form_errors(form: forms.Form) -> str:
    """A refused form's errors as one sentence for a message: ``field: why; …``."""
    return "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in form.errors.items())


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
    page = selectors.task_list_page(filters, request.GET)
    choices = {
        "states": TaskState.values,
        "reasons": STOP_REASONS,
        "agents": selectors.agent_choices(),
        # Rows get a box to tick, and the page the bulk form, for those who may act on them.
        "selectable": can(request.user, Capability.STOP) or can(request.user, Capability.APPROVE),
    }
    return _list(request, "console/tasks.html", filters, page, choices)


@require_POST
@requires(Capability.READ)
def task_bulk(request: HttpRequest) -> HttpResponse:
    """One action on many tasks of the list; each task is changed (and audited) on its own,
    and the list says which could not be and why."""
    form = BulkForm(request.POST)
    back = reverse("tasks")
    if not form.is_valid():
        errors = _form_errors(form)
        return _done(request, messages.ERROR, f"Nothing was changed: {errors}", back)
    data = form.cleaned_data
    query = QueryDict(data["query"])
    back = f"{back}?{query.urlencode()}" if query else back
    needed = Capability.APPROVE if data["action"] == "resume" else Capability.STOP
    if not can(request.user, needed):
        raise PermissionDenied(f"this needs the {needed} permission")
    if data["scope"] == "matching":
        filters = selectors.TaskFilters.from_query(query)
        if filters.errors:
            return _done(
                request, messages.ERROR, "Nothing was changed: the filters are wrong.", back
            )
        ids = selectors.task_ids(filters, limit=services.BULK_LIMIT + 1)
    else:
        ids = [int(raw) for raw in request.POST.getlist("task") if raw.isdigit() and len(raw) < 19]
    if not ids:
        return _done(request, messages.WARNING, "Nothing was changed: no task was chosen.", back)
    act = services.tasks_approve_resumption if needed is Capability.APPROVE else services.tasks_stop
    try:
        outcome = act(task_ids=ids, actor=_person(request), reason=data["reason"])
    except services.ServiceError as exc:
        return _done(request, messages.ERROR, f"Nothing was changed: {exc}", back)
    if outcome.changed:
        n = len(outcome.changed)
        listed = ", ".join(f"#{i}" for i in outcome.changed[:20])
        more = f" and {n - 20} more" if n > 20 else ""
        tasks = f"{n} task{'' if n == 1 else 's'}: {listed}{more}"
        if needed is Capability.APPROVE:
            messages.success(request, f"Approved the resumption of {tasks}.")
        else:
            # The outcome does not say which tasks were running: those are only told to
            # stop (they end before their next step), the others stopped at once.
            messages.success(
                request, f"Stopped {tasks}. Any that was running ends before its next step."
            )
    for task_id, why in list(outcome.refused.items())[:20]:
        messages.warning(request, f"#{task_id} was not changed: {why}")
    if len(outcome.refused) > 20:
        messages.warning(request, f"…and {len(outcome.refused) - 20} more were not changed.")
    if outcome.left:
        messages.info(
            request,
            f"Only {services.BULK_LIMIT} tasks are changed at a time; run it again for the rest.",
        )
    return redirect(back)


@require_GET
@requires(Capability.READ)
def task_detail(request: HttpRequest, task_id: int) -> HttpResponse:
    before = _int(request.GET.get("before"))
    detail = _found(selectors.task_detail(task_id, before=before), f"there is no task {task_id}")
    return _page(request, "console/task.html", {"d": detail, "paging_back": before is not None})


@require_GET
@requires(Capability.READ)
def task_live(request: HttpRequest, task_id: int) -> HttpResponse:
    """One tick of a task page's live view: new trace rows, gauges and status."""
    after = _int(request.GET.get("after")) or 0
    live = selectors.task_live(task_id, after=after)
    if live is None:
        return HttpResponseStopPolling()
    if live.task.is_terminal:
        if selectors.summary_pending(live.task, selectors.latest_report(task_id)):
            return HttpResponse(status=204)  # its summary turn is still to come: wait
        # It has just stopped: load the whole page once, with its stop report, phases and
        # audit trail; that page has no poller, so the polling ends here.
        return HttpResponseClientRefresh()
    last_seq = live.events[-1].seq if live.events else after
    context = {"d": live, "new_events": live.events, "last_seq": last_seq, "live": True}
    return render(request, "console/task.html#live", {**context, "can": _can(request)})


@require_GET
@requires(Capability.READ)
def task_report_json(request: HttpRequest, task_id: int) -> HttpResponse:
    missing = f"there is no stop report for task {task_id} (yet)"
    stored = _found(selectors.latest_report(task_id), missing)
    response = JsonResponse(
        selectors.report_document(stored), json_dumps_params={"indent": 2, "ensure_ascii": False}
    )
    response["Content-Disposition"] = f'attachment; filename="task-{task_id}-stop-report.json"'
    return response


# -- actions -----------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@requires(Capability.STOP)
def task_stop(request: HttpRequest, task_id: int) -> HttpResponse:
    detail = _found(selectors.task_detail(task_id), f"there is no task {task_id}")
    form = _bound(StopForm, request)
    if form.is_bound and form.is_valid():
        try:
            task = services.task_stop(
                task_id=task_id, actor=_person(request), reason=form.cleaned_data["reason"]
            )
        except services.ServiceError as exc:
            return _done(request, messages.WARNING, str(exc), _task_url(task_id))
        if not task.is_terminal:
            text = f"Stop recorded: task {task_id} ends before its next step."
        elif detail.task.can_cancel:
            text = f"Task {task_id} cancelled."
        else:
            text = f"Task {task_id} stopped."
        return _done(request, messages.SUCCESS, text, _task_url(task_id))
    return _page(request, "console/stop.html", {"d": detail, "form": form})


@require_http_methods(["GET", "POST"])
@requires(Capability.APPROVE)
def task_resume(request: HttpRequest, task_id: int) -> HttpResponse:
    resumption = _found(selectors.resumption(task_id), f"there is no task {task_id}")
    form = _bound(ResumeForm, request)
    if form.is_bound and form.is_valid():
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
            text = f"Task {task_id} resumes in a new phase."
            return _done(request, messages.SUCCESS, text, _task_url(task_id))
    context = {"d": resumption.detail, "r": resumption, "form": form}
    return _page(request, "console/resume.html", context)


@require_http_methods(["GET", "POST"])
@requires(Capability.START)
def task_new(request: HttpRequest) -> HttpResponse:
    """The start form (``?agent=`` picks the agent it opens on), and starting a task."""
    agents = selectors.startable_agents()
    examples = {card.name: card.example for card in agents}
    # The form opens on an agent and an input that fit each other: the agent asked for (a
    # link of the agents' table), else the first one, with its example input.
    name = request.GET.get("agent", "")
    if name not in examples:
        name = next(iter(examples), "")
    initial = {"agent": name, "input": examples[name]} if name else {}
    form = _bound(StartForm, request, initial=initial)
    if form.is_bound and form.is_valid():
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
    form.offer_example(examples)
    context = {"form": form, "agents": agents}
    return _page(request, "console/start.html", context)


# -- reconciliation ----------------------------------------------------------------------------


@require_GET
@requires(Capability.READ)
def operations(request: HttpRequest) -> HttpResponse:
    notice = _queue_notice(
        request, "console/operations.html", "queue-live", selectors.reconciliation_version
    )
    return notice or _page(
        request, "console/operations.html", {"queue": selectors.reconciliation()}
    )


def _queue_notice(
    request: HttpRequest, template: str, region: str, version: Callable[[], str]
) -> HttpResponse | None:
    """The live region of a queue whose rows hold forms someone may be typing into: they
    are not swapped under them, the region only says that the queue changed (204 while
    ``version`` stays the one the page has). ``None`` when the request is not its poll."""
    htmx = getattr(request, "htmx", None)
    if not (htmx and htmx.target == region):
        return None
    now = version()
    if request.GET.get("v") == now:
        return HttpResponse(status=204)
    return _page(request, f"{template}#{region}", {"version": now, "changed": True})


@require_POST
@requires(Capability.RECONCILE)
def operation_resolve(request: HttpRequest, key: str) -> HttpResponse:
    op = _found(selectors.operation(_operation_key(key)), f"there is no operation {key}")
    form = ResolveForm(request.POST, prefix=request.POST.get("prefix") or None)
    back = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = reverse("operations")

    def refused(why: str, *, override: bool = False) -> HttpResponse:
        messages.error(request, f"{key} was not changed: {why}")
        # The queue again rather than a redirect, with what was typed beside its operation,
        # so that a reconciler mends the evidence or the result instead of typing it again.
        typed = {op.id: {name: form[name].value() or "" for name in form.fields}}
        if override:
            typed[op.id]["needs_override"] = "1"
        queue = selectors.reconciliation(typed=typed)
        return _page(request, "console/operations.html", {"queue": queue})

    if not form.is_valid():
        return refused(_form_errors(form))
    committed = form.cleaned_data["decision"] == "committed"
    try:
        if committed:
            services.operation_mark_committed(
                key=key,
                actor=_person(request),
                evidence=form.cleaned_data["evidence"],
                result=form.cleaned_data["result"],
            )
        else:
            services.operation_mark_not_committed(
                key=key,
                actor=_person(request),
                evidence=form.cleaned_data["evidence"],
                override=form.cleaned_data["override"],
            )
    except services.LookupDisagrees as exc:
        return refused(str(exc), override=True)
    except services.InvalidInput as exc:
        return refused(str(exc))
    except services.ServiceError as exc:
        return _done(request, messages.WARNING, str(exc), back)
    verdict = "committed" if committed else "not committed"
    return _done(request, messages.SUCCESS, f"{key} marked {verdict}.", back)


@require_POST
@requires(Capability.RECONCILE)
def operation_lookup(request: HttpRequest, key: str) -> HttpResponse:
    """Ask the tool's own lookup what the business system knows of ``key``; changes nothing."""
    try:
        op, found = services.operation_look_up(key=_operation_key(key), actor=_person(request))
    except services.NotFound as exc:
        raise Http404(str(exc)) from exc
    if getattr(request, "htmx", None):
        return _page(request, "console/operations.html#lookup", {"op": op, "found": found})
    # Without JavaScript: the whole queue, with the answer in place.
    queue = selectors.reconciliation({op.id: found})
    return _page(request, "console/operations.html", {"queue": queue})


# -- approvals ---------------------------------------------------------------------------------


@require_GET
@requires(Capability.READ)
def approvals(request: HttpRequest) -> HttpResponse:
    """The approval queue: every held call in full, and the answers of the last 24 hours."""
    notice = _queue_notice(
        request, "console/approvals.html", "approvals-live", selectors.approvals_version
    )
    return notice or _page(request, "console/approvals.html", {"queue": selectors.approvals()})


@require_POST
@requires(Capability.APPROVE)
def approval_answer(request: HttpRequest, approval_id: int) -> HttpResponse:
    """Approve or reject one held call, with a reason. Approving a held call is approving
    that task's resumption, so it needs the approver's role (Capability.APPROVE)."""
    held = _found(selectors.approval(approval_id), f"there is no approval {approval_id}")
    form = ApprovalForm(request.POST)
    back = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = reverse("approvals")

    def refused(why: str) -> HttpResponse:
        messages.error(request, f"Approval #{approval_id} was not answered: {why}")
        # The queue again rather than a redirect, with what was typed kept beside its call
        # (or apart, when the call has left the queue), so nobody types a reason twice.
        typed = {held.id: {name: str(form[name].value() or "") for name in form.fields}}
        queue = selectors.approvals(typed=typed, refused=why)
        return _page(request, "console/approvals.html", {"queue": queue})

    if not form.is_valid():
        return refused(_form_errors(form))
    reason = form.cleaned_data["reason"]
    try:
        if form.approves:
            services.approval_approve(approval_id=held.id, actor=_person(request), reason=reason)
        else:
            services.approval_reject(
                approval_id=held.id, actor=_person(request), reason=reason, resume=form.resumes
            )
    except services.NotFound as exc:
        raise Http404(str(exc)) from exc
    except services.ServiceError as exc:
        # Stale (someone answered first), refused (a write of the task is in doubt) or
        # invalid (the reason cannot be stored): said on the page, the typing kept.
        return refused(str(exc))
    if form.approves:
        text = f"Approved: task {held.task_id} runs the call to {held.tool} in a new phase."
    elif form.resumes:
        text = f"Rejected: task {held.task_id} goes on, and its model is told why."
    else:
        text = f"Rejected: task {held.task_id} ended (approval_rejected)."
    return _done(request, messages.SUCCESS, text, back)


# -- audit -------------------------------------------------------------------------------------


@require_GET
@requires(Capability.READ)
def audit(request: HttpRequest) -> HttpResponse:
    filters = selectors.AuditFilters.from_query(request.GET)
    page = selectors.audit_page(filters, request.GET)
    return _list(request, "console/audit.html", filters, page, {"actions": AuditAction.choices})


@require_GET
@requires(Capability.READ)
def audit_export(request: HttpRequest, fmt: str) -> HttpResponseBase:
    if fmt not in ("csv", "json"):
        raise Http404("the audit log exports as .csv or .json")
    filters = selectors.AuditFilters.from_query(request.GET)
    if filters.errors:
        # An export of everything instead of what was asked for would be a silent lie.
        wrong = "; ".join(f"{name}: {why}" for name, why in filters.errors.items())
        return HttpResponseBadRequest(f"the export was not made: {wrong}")
    rows = selectors.audit_rows(filters)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    if fmt == "json":
        response = StreamingHttpResponse(_json_lines(rows), content_type="application/json")
    else:
        response = StreamingHttpResponse(_csv_lines(rows), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="loopguard-audit-{stamp}.{fmt}"'
    return response


def _json_lines(rows: Iterator[Mapping[str, Any]]) -> Iterator[str]:
    yield "["
    for i, row in enumerate(rows):
        yield ("," if i else "") + "\n" + json.dumps(row, ensure_ascii=False)
    yield "\n]\n"


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_lines(rows: Iterator[Mapping[str, Any]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(selectors.AUDIT_COLUMNS)
    for row in rows:
        cells = {**row, "before": _text(row["before"]), "after": _text(row["after"])}
        # A cell starting with = + - @ is a formula to a spreadsheet: neutralise it.
        yield writer.writerow([_cell(cells[name]) for name in selectors.AUDIT_COLUMNS])


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


# -- health ------------------------------------------------------------------------------------


@login_not_required
@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when the database and the broker both respond, 503 otherwise (see
    :mod:`console.web.health`)."""
    found = health.health()
    return JsonResponse(found.to_dict(), status=200 if found.healthy else 503)


# -- helpers -----------------------------------------------------------------------------------


def _found[T](value: T | None, missing: str) -> T:
    """``value``, or a 404 saying what is ``missing``."""
    if value is None:
        raise Http404(missing)
    return value


def _bound[F: forms.Form](
    form_class: type[F], request: HttpRequest, *, initial: Mapping[str, Any] | None = None
) -> F:
    """The page's form: bound to what was posted, or blank (with ``initial``) on a GET."""
    data = request.POST if request.method == "POST" else None
    return form_class(data, initial=dict(initial or {}))


def _person(request: HttpRequest) -> User:
    """The signed-in person acting (the middleware lets no one else this far)."""
    if not isinstance(request.user, User):
        raise PermissionDenied("a signed-in person is required")
    return request.user


def _operation_key(key: str) -> str:
    """``key`` from the path, or a 400 when no operation could have it (a well-formed key
    that names nothing is a 404 further on)."""
    problem = key_problem(key)
    if problem is not None:
        raise BadRequest(problem)
    return key


def _int(raw: str | None) -> int | None:
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _task_url(task_id: int) -> str:
    return reverse("task", args=[task_id])
