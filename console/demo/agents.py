"""The built-in demo agents: one per row of the design's behaviour table, run for real.

Each one has a scripted planner standing in for an LLM, tools acting on the support desk
(``console.demo.desk``) and an inspector that verifies progress from the desk's tables. Writes
carry operation keys derived from the input (``incident-<id>-first-notice``), so that
reconciling an uncertain write means finding, or not finding, a real row.

Time is real in hosted runs: limits and waits are in real milliseconds, small enough to
keep a run under a few seconds (except ``SlowJob`` waiting for long and ``LongRunner``).
Whatever a planner must remember across a restart is kept in ``self.memory``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from console.agents.base import Agent, Tool
from console.demo import desk
from console.demo.models import ExportJob, Notice, Order
from console.demo.tools import (
    Field,
    check_input,
    notice_call,
    notice_matches,
    notice_tool,
    order_confirmed,
    order_tool,
    page_call,
    page_tool,
    succeeded,
    verify_page,
)
from guard import Call, Evidence, Finish, Kind, Result, Settlement
from guard.__main__ import BASE as BEHAVIOUR_TABLE_LIMITS

__all__ = [
    "BASE_LIMITS",
    "BudgetBurner",
    "ClaimedProgress",
    "KeyConflict",
    "LongRunner",
    "LostResponse",
    "MissingPrecondition",
    "Oscillation",
    "Paging",
    "PaidReader",
    "PermanentError",
    "RepeatedWrite",
    "RetryingRead",
    "SlowJob",
    "UnknownKind",
    "UnverifiedFinish",
]

# The behaviour table's base limits (``python -m guard`` replays the same table); each demo
# changes only what its row names.
BASE_LIMITS: Mapping[str, Any] = BEHAVIOUR_TABLE_LIMITS

# Who incident notices go to, and what the first one says. The demos that send a first
# notice all send exactly this, so one incident's first notice is one business action
# (one fingerprint) whichever demo sends it.
INCIDENT_RECIPIENT = "customers@example.com"


def first_notice_text(incident: int) -> str:
    """The text of an incident's first notice."""
    return f"Incident {incident}: we are investigating and will update you within the hour."


def _notice_exists(key: str) -> bool:
    return desk.notice_find(key) is not None


class _Demo(Agent):
    """A demo agent: input checked against ``fields``, planner notes in ``memory``."""

    fields: ClassVar[Mapping[str, Field]] = {}
    default_limits: ClassVar[Mapping[str, Any]] = BASE_LIMITS

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        super().__init__(task_id, input, memory)
        self.options = check_input(self.fields, input)

    @classmethod
    def validate_input(cls, input: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` saying which field of ``input`` is missing or wrong."""
        check_input(cls.fields, input)

    @property
    def notes(self) -> dict[str, Any]:
        """The planner's own notes: what a model would keep in its conversation."""
        notes: dict[str, Any] = self.memory.setdefault("planner", {})
        return notes


class _PageReader(_Demo):
    """Reads desk pages in order; a page counts once the desk confirms its content."""

    def collection(self) -> str:
        """The collection this agent reads."""
        return "archive"

    def goal_pages(self) -> int:
        """How many verified pages meet the goal."""
        return desk.page_count(self.collection())

    def tools(self) -> Sequence[Tool]:
        """``read_page`` (read)."""
        return [page_tool()]

    def next_pages(self, count: int = 1) -> list[Call]:
        """The next ``count`` page reads after the last verified page."""
        # From the verified pages, which the runner saves after every step, rather than from
        # the last observation: a phase resumed after a stop starts with no observation.
        verified: list[int] = self.memory.get("verified_pages", [])
        first = max(verified, default=0) + 1
        return [page_call(self.collection(), first + i) for i in range(count)]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Ask for the page after the last one verified."""
        return self.next_pages()[0]

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Revision: pages whose content the desk confirms; done once the goal is read."""
        verified = verify_page(self.memory, result, step)
        goal = self.goal_pages()
        return Evidence(len(verified), goal > 0 and len(verified) >= goal)


class Paging(_PageReader):
    """Three valid pages arrive in order: three executions, ``COMPLETED``, revision 3."""

    name = "paging"
    title = "Paging"
    description = "Reads a report page by page; each page counts once the desk confirms it."
    example_input: ClassVar[Mapping[str, Any]] = {"collection": "reports"}
    fields: ClassVar[Mapping[str, Field]] = {"collection": Field(str, default="reports")}

    def collection(self) -> str:
        """The collection named in the input (``reports``: three pages)."""
        collection: str = self.options["collection"]
        return collection


class RetryingRead(_Demo):
    """The same read keeps returning ``RETRYABLE``: two executions, then ``same_call``."""

    name = "retrying_read"
    title = "Retrying read"
    description = "Keeps asking a carrier that is down for a delivery status, with the same call."
    example_input: ClassVar[Mapping[str, Any]] = {"order": 42}
    fields: ClassVar[Mapping[str, Field]] = {"order": Field(int, default=42)}

    def tools(self) -> Sequence[Tool]:
        """``fetch_status`` (read), whose service is down."""

        def run(call: Call) -> Result:
            return Result(Kind.RETRYABLE, {"error": "the carrier is unavailable"}, wait_ms=10)

        return [Tool("fetch_status", "read", run, description="Ask the carrier for a status.")]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Ask again, with exactly the same arguments."""
        return Call("fetch_status", {"order": self.options["order"]})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Nothing gets verified: only a status the carrier delivered would count."""
        return Evidence(0, False)


class Oscillation(_Demo):
    """Reads A, B alternate without progress: three executions, the fourth is ``short_cycle``."""

    name = "oscillation"
    title = "Oscillation"
    description = "Goes back and forth between the orders and the notices, learning nothing new."
    example_input: ClassVar[Mapping[str, Any]] = {"incident": 7}
    default_limits: ClassVar[Mapping[str, Any]] = {**BASE_LIMITS, "stagnant": 5}
    fields: ClassVar[Mapping[str, Field]] = {"incident": Field(int, default=7)}

    def tools(self) -> Sequence[Tool]:
        """``read_orders`` and ``read_notices`` (reads of the desk)."""

        def read_orders(call: Call) -> Result:
            open_orders = Order.objects.filter(status=call.args.get("status"))
            return Result(Kind.SUCCESS, {"orders": [o.number for o in open_orders]})

        def read_notices(call: Call) -> Result:
            prefix = f"incident-{call.args.get('incident')}-"
            found = Notice.objects.filter(idempotency_key__startswith=prefix)
            return Result(Kind.SUCCESS, {"notices": [n.idempotency_key for n in found]})

        return [
            Tool("read_orders", "read", read_orders, description="List orders by status."),
            Tool("read_notices", "read", read_notices, description="List an incident's notices."),
        ]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Orders, notices, orders, notices… never deciding anything."""
        turn = self.notes.get("turn", 0)
        self.notes["turn"] = turn + 1
        if turn % 2 == 0:
            return Call("read_orders", {"status": "open"})
        return Call("read_notices", {"incident": self.options["incident"]})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """The goal is the incident's reply notice, which reading alone never produces."""
        replied = _notice_exists(f"incident-{self.options['incident']}-reply")
        return Evidence(int(replied), replied)


class ClaimedProgress(_Demo):
    """Arguments change, time passes, the model claims progress: ``no_progress``, revision 0."""

    name = "claimed_progress"
    title = "Claimed progress"
    description = "Searches with ever new words and says it is 90% done; nothing verified changes."
    example_input: ClassVar[Mapping[str, Any]] = {"incident": 7}
    fields: ClassVar[Mapping[str, Field]] = {"incident": Field(int, default=7)}

    def tools(self) -> Sequence[Tool]:
        """``search`` (read): notices whose text contains the query."""

        def search(call: Call) -> Result:
            found = Notice.objects.filter(text__icontains=str(call.args.get("q", "")))
            matches = [n.idempotency_key for n in found[:10]]
            return Result(Kind.SUCCESS, {"matches": matches, "claimed": "nearly there"})

        return [Tool("search", "read", search, description="Search the desk's notices.")]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """A new query every time, with a confident note about progress."""
        step = self.notes.get("step", 0)
        self.notes["step"] = step + 1
        return Call("search", {"q": f"root cause, attempt {step}", "note": "progress: 90%"})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """The goal is a root-cause notice in the desk; the model's note counts for nothing."""
        found = _notice_exists(f"incident-{self.options['incident']}-root-cause")
        return Evidence(int(found), found)


class RepeatedWrite(_Demo):
    """A committed write requested again and again: one execution, reuses, ``no_progress``."""

    name = "repeated_write"
    title = "Repeated write"
    description = "Re-sends an incident's first notice instead of moving on; it goes out once."
    example_input: ClassVar[Mapping[str, Any]] = {"incident": 101}
    default_limits: ClassVar[Mapping[str, Any]] = {**BASE_LIMITS, "same": 3}
    fields: ClassVar[Mapping[str, Field]] = {"incident": Field(int)}

    def tools(self) -> Sequence[Tool]:
        """``send_notice`` (write, with a lookup by operation key)."""
        return [notice_tool()]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """The first notice, again."""
        incident = self.options["incident"]
        return notice_call(
            key=f"incident-{incident}-first-notice",
            recipient=INCIDENT_RECIPIENT,
            text=first_notice_text(incident),
        )

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """The goal is the follow-up notice; the first one being sent is not progress."""
        followed_up = _notice_exists(f"incident-{self.options['incident']}-follow-up")
        committed = notice_matches(step) if isinstance(step, Call) else None
        return Evidence(int(followed_up), followed_up, committed)


class LostResponse(_Demo):
    """A write commits but its response is lost: ``UNKNOWN``, ``NEEDS_HUMAN``; then resumable.

    The first attempt's response is lost once per operation key, a fact the desk keeps.
    After a reconciler marks the notice committed and an approver resumes the task, the
    planner asks for the same notice, the ledger hands back the committed result and the
    inspector finds the row: ``COMPLETED``, and still exactly one notice.
    """

    name = "lost_response"
    title = "Lost response"
    description = "Sends a notice whose response is lost after it went out; a human reconciles it."
    example_input: ClassVar[Mapping[str, Any]] = {"incident": 102}
    fields: ClassVar[Mapping[str, Field]] = {"incident": Field(int)}
    # The point of the demo is a human reconciling the notice, so the runner must not let
    # the tool's lookup settle it first.
    auto_lookup = False

    @property
    def notice(self) -> Call:
        """The one write this agent makes."""
        incident = self.options["incident"]
        return notice_call(
            key=f"incident-{incident}-first-notice",
            recipient=INCIDENT_RECIPIENT,
            text=first_notice_text(incident),
        )

    def tools(self) -> Sequence[Tool]:
        """``send_notice`` (write) losing its first response; its lookup reads the desk."""
        # The lookup stays on the tool for reconcilers; `auto_lookup` keeps the runner from
        # handing it to the guard.
        return [notice_tool(lose_response=True)]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Send the notice until it is reported sent, then finish."""
        if succeeded(observation):
            return Finish("The first notice is out.")
        return self.notice

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Done when the desk holds the notice, exactly as asked for."""
        sent = notice_matches(self.notice)
        committed = notice_matches(step) if isinstance(step, Call) else None
        return Evidence(int(sent), sent, committed)


class KeyConflict(_Demo):
    """One operation key, other input: the first executes, the second is ``operation_conflict``."""

    name = "key_conflict"
    title = "Key conflict"
    description = "Rewrites a sent notice and re-sends it under the same key; a human decides."
    example_input: ClassVar[Mapping[str, Any]] = {"incident": 103}
    fields: ClassVar[Mapping[str, Field]] = {"incident": Field(int)}

    @property
    def key(self) -> str:
        """The operation key both drafts are (wrongly) sent under."""
        return f"incident-{self.options['incident']}-first-notice"

    def corrected_text(self) -> str:
        """The text the model decides it should have sent."""
        return f"Incident {self.options['incident']}: fixed; a report follows at 10:30 UTC."

    def tools(self) -> Sequence[Tool]:
        """``send_notice`` (write, with a lookup by operation key)."""
        return [notice_tool()]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """The first draft, then — once it went out — a corrected draft under the same key."""
        if succeeded(observation):
            self.notes["rewrote"] = True
        text = (
            self.corrected_text()
            if self.notes.get("rewrote")
            else first_notice_text(self.options["incident"])
        )
        return notice_call(key=self.key, recipient=INCIDENT_RECIPIENT, text=text)

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Revision: a notice under the key; done only if it carries the corrected text."""
        notice = desk.notice_find(self.key)
        corrected = notice is not None and notice.text == self.corrected_text()
        committed = notice_matches(step) if isinstance(step, Call) else None
        return Evidence(int(notice is not None), corrected, committed)


class PermanentError(_Demo):
    """A permanent error: one execution, ``FAILED``/``fatal``."""

    name = "permanent_error"
    title = "Permanent error"
    description = "Asks for an invoice the desk will never share; retrying cannot help."
    example_input: ClassVar[Mapping[str, Any]] = {"order": 42}
    fields: ClassVar[Mapping[str, Field]] = {"order": Field(int, default=42)}

    def tools(self) -> Sequence[Tool]:
        """``download_invoice`` (read), refused for good."""

        def run(call: Call) -> Result:
            error = "permission denied: invoices are not shared with agents"
            return Result(Kind.FATAL, {"error": error})

        return [Tool("download_invoice", "read", run, description="Download an invoice.")]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Ask for the invoice."""
        return Call("download_invoice", {"order": self.options["order"]})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Nothing is verified: the invoice never arrives."""
        return Evidence(0, False)


class MissingPrecondition(_Demo):
    """A missing precondition: one execution, ``NEEDS_HUMAN``/``precondition``."""

    name = "missing_precondition"
    title = "Missing precondition"
    description = "Looks up an order the desk does not have; someone must supply it."
    example_input: ClassVar[Mapping[str, Any]] = {"order": 404}
    fields: ClassVar[Mapping[str, Field]] = {"order": Field(int, default=404)}

    def tools(self) -> Sequence[Tool]:
        """``order_lookup`` (read)."""
        return [order_tool()]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Look the order up; finish once it is found."""
        if succeeded(observation):
            return Finish(observation.data)
        return Call("order_lookup", {"order": self.options["order"]})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Done once a lookup returned what the desk holds for the order."""
        facts: dict[str, bool] = self.memory.setdefault("verified", {})
        if isinstance(step, Call):
            facts["order"] = facts.get("order", False) or order_confirmed(
                result, self.options["order"]
            )
        found = facts.get("order", False)
        return Evidence(int(found), found)


class SlowJob(_Demo):
    """Waiting for a ``PENDING`` job would cross the deadline: ``PARTIAL``/``deadline``.

    Starts an export job (a write, once per job) and polls its status, waiting ``wait_ms``
    between polls. The job finishes after ``polls`` checks, or never when ``polls`` is not
    given. With a long deadline it simply keeps waiting, which is how an operator's stop of
    a sleeping worker is shown.
    """

    name = "slow_job"
    title = "Slow job"
    description = "Starts an export and waits for it; the wait would run past the deadline."
    example_input: ClassVar[Mapping[str, Any]] = {"job": 9, "wait_ms": 2000}
    fields: ClassVar[Mapping[str, Field]] = {
        "job": Field(int, default=9),
        "wait_ms": Field(int, default=2000),
        "polls": Field(int, default=None),
    }

    @property
    def key(self) -> str:
        """The operation key of starting this job (the desk's idempotency key too)."""
        return f"export-{self.options['job']}-start"

    def start_call(self) -> Call:
        """The write that starts the job."""
        args = {
            "job": self.options["job"],
            "collection": "archive",
            "polls_needed": self.options["polls"],
        }
        return Call("start_export", args, "write", self.key)

    def tools(self) -> Sequence[Tool]:
        """``start_export`` (write, with a lookup) and ``job_status`` (read)."""
        wait_ms: int = self.options["wait_ms"]

        def start(call: Call) -> Result:
            polls = call.args.get("polls_needed")
            try:
                job = desk.export_start(
                    collection=str(call.args.get("collection")),
                    polls_needed=polls,
                    idempotency_key=call.operation_key or "",
                )
            except (desk.IdempotencyConflict, ValueError) as error:
                return Result(Kind.FATAL, {"error": str(error)})
            return Result(Kind.SUCCESS, _job_data(job))

        def status(call: Call) -> Result:
            try:
                job = desk.export_poll(idempotency_key=f"export-{call.args.get('job')}-start")
            except desk.JobNotFound:
                return Result(Kind.PRECONDITION, {"missing": "job", "job": call.args.get("job")})
            if job.finished:
                return Result(Kind.SUCCESS, _job_data(job))
            return Result(Kind.PENDING, _job_data(job), wait_ms=wait_ms)

        return [
            Tool(
                "start_export",
                "write",
                start,
                lookup=_job_settlement,
                description="Start an export job (once per operation key).",
            ),
            Tool("job_status", "read", status, description="Check an export job."),
        ]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Start the job once, then poll it until it is done."""
        notes = self.notes
        if succeeded(observation):
            if notes.get("asked") == "job_status":
                return Finish("The export is done.")
            notes["started"] = True
        if not notes.get("started"):
            notes["asked"] = "start_export"
            return self.start_call()
        notes["asked"] = "job_status"
        return Call("job_status", {"job": self.options["job"]})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Revision: the job exists as asked (1), and it finished (2); done when finished."""
        job = desk.export_find(self.key)
        start = self.start_call().args
        started = job is not None and (job.collection, job.polls_needed) == (
            start["collection"],
            start["polls_needed"],
        )
        finished = started and job is not None and job.finished
        committed = started if isinstance(step, Call) and step.effect == "write" else None
        return Evidence(int(started) + int(finished), finished, committed)


def _job_data(job: ExportJob) -> dict[str, Any]:
    return {
        "job": job.idempotency_key,
        "status": "done" if job.finished else "running",
        "polls_done": job.polls_done,
    }


def _job_settlement(operation_key: str) -> Settlement:
    """Settle a job start from the desk's records."""
    job = desk.export_find(operation_key)
    if job is None:
        return Settlement(False, evidence=f"the desk holds no export job {operation_key}")
    evidence = f"desk export job #{job.pk} started at {job.created_at:%Y-%m-%d %H:%M:%S %Z}"
    return Settlement(True, Result(Kind.SUCCESS, _job_data(job)), evidence=evidence)


class _Summarising(_PageReader):
    """A page reader that, with ``{"summary": "yes"}``, answers the user once more after a
    budget stop: a scripted summary turn standing in for the model's."""

    @property
    def summary_turn(self) -> bool:  # type: ignore[override]  # chosen per task
        """On when the input asks for it."""
        return bool(self.options.get("summary") == "yes")

    def summarise(self, prompt: str, observation: Any) -> Any:
        """What a model would say: how far it got, and why it stopped (from ``prompt``)."""
        read = len(self.memory.get("verified_pages", []))
        why = prompt.split(":", 1)[0].removeprefix("The task was ")
        return (
            f"I read {read} of {self.goal_pages()} pages of the {self.collection()} before I "
            f"was {why}. The rest is not read yet; a person can grant more budget to finish."
        )


class BudgetBurner(_Summarising):
    """A budget runs out: the next model call or execution is refused before it starts.

    ``{"dimension": "model_calls"}`` reads one page per model call and runs out of model
    calls; ``{"dimension": "executions"}`` fans out three reads per model call and runs
    out of executions in the middle of the second model call, before any of it runs.
    ``{"summary": "yes"}`` adds the summary turn after the stop.
    """

    name = "budget_burner"
    title = "Budget burner"
    description = "Reads the archive faster than its budget allows; the guard refuses the excess."
    example_input: ClassVar[Mapping[str, Any]] = {"dimension": "model_calls"}
    default_limits: ClassVar[Mapping[str, Any]] = {
        **BASE_LIMITS,
        "model_calls": 2,
        "executions": 3,
    }
    fields: ClassVar[Mapping[str, Field]] = {
        "dimension": Field(str, default="model_calls", choices=("model_calls", "executions")),
        "summary": Field(str, default="no", choices=("yes", "no")),
    }

    def goal_pages(self) -> int:
        """Ten pages: more than either budget allows."""
        return 10

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """One page per model call, or three in parallel."""
        fan_out = 3 if self.options["dimension"] == "executions" else 1
        calls = self.next_pages(fan_out)
        return calls if fan_out > 1 else calls[0]


class PaidReader(_Summarising):
    """Money runs out: each model call reserves its maximum cost first, and the call whose
    reservation does not fit is refused before it starts (``PARTIAL``/``spend_budget``).

    Its scripted planner stands in for a priced model (``demo-scripted`` in
    ``LOOPGUARD_MODEL_PRICES``): each call reserves 1,000 tokens in and its 500-token cap
    out, and reports 1,000 in and 200 out. At the default prices (2 and 8 per million
    tokens, in millionths of a dollar: 6,000 reserved, 3,600 spent) a spend budget of
    20,000 pays for four calls; the fifth's reservation no longer fits.
    """

    name = "paid_reader"
    title = "Paid reader"
    description = "Reads the archive on a priced model until its spend budget runs out."
    example_input: ClassVar[Mapping[str, Any]] = {"pages": 10}
    default_limits: ClassVar[Mapping[str, Any]] = {
        **BASE_LIMITS,
        "deadline_ms": 5000,
        "model_calls": 20,
        "requests": 20,
        "executions": 20,
        "spend": 20_000,
    }
    fields: ClassVar[Mapping[str, Field]] = {
        "pages": Field(int, default=10, maximum=10),
        "summary": Field(str, default="no", choices=("yes", "no")),
    }
    model = "demo-scripted"
    max_output_tokens = 500

    def goal_pages(self) -> int:
        """As many pages as the input asks for (the archive has ten)."""
        pages: int = self.options["pages"]
        return pages

    def prompt_tokens(self, observation: Any) -> int:
        """What its scripted prompt would be: a thousand tokens."""
        return 1000

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """The next page, reporting the usage a model's reply would."""
        self.tokens, self.input_tokens, self.output_tokens = 1200, 1000, 200
        if len(self.memory.get("verified_pages", [])) >= self.goal_pages():
            return Finish(f"read {self.goal_pages()} pages")
        return self.next_pages()[0]


class UnknownKind(_Demo):
    """A tool answers with a kind outside the closed set: ``FAILED``/``bad_result``."""

    name = "unknown_kind"
    title = "Unknown result kind"
    description = "Its fraud check answers MAYBE, which is not a result kind the guard accepts."
    example_input: ClassVar[Mapping[str, Any]] = {"order": 42}
    fields: ClassVar[Mapping[str, Field]] = {"order": Field(int, default=42)}

    def tools(self) -> Sequence[Tool]:
        """``check_fraud`` (read), answering ``MAYBE``."""

        def run(call: Call) -> Result:
            return Result("MAYBE", {"score": 0.5})

        return [Tool("check_fraud", "read", run, description="Score an order for fraud.")]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Check the order."""
        return Call("check_fraud", {"order": self.options["order"]})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Nothing is verified: no fraud verdict is recorded."""
        return Evidence(0, False)


class UnverifiedFinish(_Demo):
    """The model declares finish without the goal verified: ``PARTIAL``/``goal_unverified``."""

    name = "unverified_finish"
    title = "Unverified finish"
    description = "Looks an order up, then says the apology was sent; the desk has no such notice."
    example_input: ClassVar[Mapping[str, Any]] = {"order": 42}
    fields: ClassVar[Mapping[str, Field]] = {"order": Field(int, default=42)}

    def tools(self) -> Sequence[Tool]:
        """``order_lookup`` (read)."""
        return [order_tool()]

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Look the order up, then claim the job is done."""
        if observation is not None:
            return Finish("All done, the customer got our apology. Trust me.")
        return Call("order_lookup", {"order": self.options["order"]})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """The goal is the apology notice in the desk, which was never sent."""
        apologised = _notice_exists(f"order-{self.options['order']}-apology")
        return Evidence(int(apologised), apologised)


class LongRunner(_PageReader):
    """Reads the archive slowly (about 30 s by default), verified progress on every page.

    Each read takes ``delay_ms`` inside the tool, so an operator can watch the trace grow
    and stop the task; ``{"pages": 3, "delay_ms": 0}`` makes it short.
    """

    name = "long_runner"
    title = "Long runner"
    description = "Reads a hundred archive pages slowly, making verified progress on each one."
    example_input: ClassVar[Mapping[str, Any]] = {"pages": 100, "delay_ms": 300}
    default_limits: ClassVar[Mapping[str, Any]] = {
        "deadline_ms": 120_000,
        "model_calls": 130,
        "requests": 130,
        "executions": 130,
        "same": 2,
        "stagnant": 3,
    }
    fields: ClassVar[Mapping[str, Field]] = {
        "pages": Field(int, default=100, maximum=desk.DEMO_PAGES["archive"]),
        "delay_ms": Field(int, default=300, minimum=0, maximum=10_000),
    }

    def goal_pages(self) -> int:
        """The number of pages asked for."""
        pages: int = self.options["pages"]
        return pages

    def tools(self) -> Sequence[Tool]:
        """``read_page`` (read), slow."""
        delay_ms: int = self.options["delay_ms"]
        # A short sleep inside the tool: the guard checks for a stop before every model
        # call and execution, so a stop takes effect within one page.
        return [page_tool(before=lambda: time.sleep(delay_ms / 1000))]
