"""The support desk agent: look an order up, refund it, tell the customer, finish.

Its planner is scripted and stands in for an LLM; its tools act on the desk's real tables
(``console.demo.desk``) and its inspector verifies progress from those tables only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from console.agents.base import Agent, Tool
from console.agents.model import ChatAgent
from console.demo import desk
from console.demo.models import Refund
from console.demo.tools import (
    Field,
    check_input,
    desk_settlement,
    notice_matches,
    notice_tool,
    order_confirmed,
    order_tool,
    succeeded,
)
from guard import Call, Evidence, Finish, Kind, Result, Settlement
from guard.adapters import ToolSpec

_STEPS = ("order_lookup", "refund", "notify_customer")


class SupportDesk(Agent):
    """Refund a customer's order and notify them, once, whatever happens to the responses.

    Input: ``{"order": 42, "amount_cents": 1500, "reason": "..."}``, and optionally
    ``"lose_response": "refund" | "notify_customer"`` to have that write commit and then
    lose its response on its first attempt (the fault is remembered by the desk, so a
    resumed task does not lose it again), and ``"approve_above_cents": N`` to have a
    person approve a refund of more than N cents before it runs.
    """

    name = "support_desk"
    title = "Support desk"
    description = (
        "Looks an order up, refunds it and notifies the customer, each write exactly once; "
        "with approve_above_cents, a larger refund waits for an approver."
    )
    example_input: ClassVar[Mapping[str, Any]] = {
        "order": 42,
        "amount_cents": 1500,
        "reason": "the parcel arrived damaged",
    }
    default_limits: ClassVar[Mapping[str, Any]] = {
        "deadline_ms": 5000,
        "model_calls": 8,
        "requests": 8,
        "executions": 6,
        "same": 2,
        "stagnant": 3,
    }
    fields: ClassVar[Mapping[str, Field]] = {
        "order": Field(int),
        "amount_cents": Field(int),
        "reason": Field(str),
        "lose_response": Field(str, default=None, choices=("refund", "notify_customer")),
        "approve_above_cents": Field(int, default=None, minimum=0),
    }

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        super().__init__(task_id, input, memory)
        options = check_input(self.fields, input)
        self.order: int = options["order"]
        self.amount_cents: int = options["amount_cents"]
        self.reason: str = options["reason"]
        self.lose_response: str | None = options["lose_response"]
        self.approve_above_cents: int | None = options["approve_above_cents"]

    @classmethod
    def validate_input(cls, input: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` unless ``input`` names an order, an amount and a reason."""
        check_input(cls.fields, input)

    @property
    def refund_key(self) -> str:
        """The operation key of this order's refund (also the desk's idempotency key)."""
        return f"order-{self.order}-refund"

    @property
    def notice_key(self) -> str:
        """The operation key of the notice telling the customer about the refund."""
        return f"order-{self.order}-refund-notice"

    def tools(self) -> Sequence[Tool]:
        """``order_lookup`` (read), ``refund`` and ``notify_customer`` (writes, with lookups)."""
        return [
            order_tool(),
            Tool(
                "refund",
                "write",
                self._refund,
                lookup=_refund_settlement,
                description="Refund an order (once per operation key).",
                approval="never" if self.approve_above_cents is None else self._large_refund,
            ),
            notice_tool("notify_customer", lose_response=self.lose_response == "notify_customer"),
        ]

    def _large_refund(self, call: Call) -> bool:
        """A refund above the input's limit waits for a person (an unreadable amount too)."""
        cents = call.args.get("amount_cents")
        limit = self.approve_above_cents
        return limit is not None and (not isinstance(cents, int) or cents > limit)

    # -- the model -----------------------------------------------------------------------

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        """Look up, refund, notify, finish; a step is done once it returned ``SUCCESS``."""
        notes: dict[str, Any] = self.memory.setdefault(
            "planner", {"done": [], "email": None, "asked": None}
        )
        asked = notes["asked"]
        if succeeded(observation) and asked is not None:
            if asked not in notes["done"]:
                notes["done"].append(asked)
            if asked == "order_lookup":
                notes["email"] = observation.data["customer_email"]
        step = next((s for s in _STEPS if s not in notes["done"]), None)
        notes["asked"] = step
        if step == "order_lookup":
            return Call("order_lookup", {"order": self.order})
        if step == "refund":
            refund = {"order": self.order, "amount_cents": self.amount_cents}
            return Call("refund", refund, "write", self.refund_key)
        if step == "notify_customer":
            notice = {"order": self.order, "recipient": notes["email"], "text": self._notice_text()}
            return Call("notify_customer", notice, "write", self.notice_key)
        return Finish(f"Order {self.order} refunded and the customer notified.")

    def _notice_text(self) -> str:
        # Derived from the input only, so that a resumed phase asks for exactly the same
        # write (same fingerprint) and the ledger can reuse it.
        amount = f"{self.amount_cents // 100}.{self.amount_cents % 100:02d}"
        return f"We refunded {amount} for order {self.order}: {self.reason}."

    # -- the business system -------------------------------------------------------------

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        """Count verified facts: the order as looked up, the refund row, the notice row."""
        facts: dict[str, bool] = self.memory.setdefault("verified", {})
        if isinstance(step, Call) and step.tool == "order_lookup" and result is not None:
            facts["order"] = facts.get("order", False) or order_confirmed(result, self.order)
        refunded = _refund_matches(self.refund_key, self.order, self.amount_cents)
        notice = desk.notice_find(self.notice_key)
        notified = (
            notice is not None and notice.order is not None and notice.order.number == self.order
        )
        committed: bool | None = None
        if isinstance(step, Call) and step.tool == "refund":
            committed = _refund_matches(
                step.operation_key or "", step.args.get("order"), step.args.get("amount_cents")
            )
        elif isinstance(step, Call) and step.tool == "notify_customer":
            committed = notice_matches(step)
        revision = int(facts.get("order", False)) + int(refunded) + int(notified)
        return Evidence(revision, refunded and notified, committed)

    # -- tools ---------------------------------------------------------------------------

    def _refund(self, call: Call) -> Result:
        key = call.operation_key
        number, cents = call.args.get("order"), call.args.get("amount_cents")
        if not key or not isinstance(number, int) or not isinstance(cents, int):
            return Result(Kind.FATAL, {"error": "a refund needs an operation key, order, amount"})
        try:
            refund = desk.order_refund(number=number, amount_cents=cents, idempotency_key=key)
        except desk.OrderNotFound:
            return Result(Kind.PRECONDITION, {"missing": "order", "order": number})
        except desk.RefundRefused as error:
            return Result(Kind.PRECONDITION, {"refused": str(error)})
        except desk.IdempotencyConflict as error:
            return Result(Kind.FATAL, {"conflict": str(error)})
        except ValueError as error:
            return Result(Kind.FATAL, {"error": str(error)})
        if self.lose_response == "refund" and desk.fault_trip_once(operation_key=key):
            raise TimeoutError(f"the desk made refund {key} but its response was lost")
        return Result(Kind.SUCCESS, _refund_data(refund))


def _refund_data(refund: Refund) -> dict[str, Any]:
    return {"refund": refund.pk, "order": refund.order.number, "amount_cents": refund.amount_cents}


def _refund_matches(key: str, order: Any, amount_cents: Any) -> bool:
    refund = desk.refund_find(key)
    return refund is not None and (refund.order.number, refund.amount_cents) == (
        order,
        amount_cents,
    )


def _refund_settlement(operation_key: str) -> Settlement:
    """Settle a refund write from the desk's records."""

    def described(refund: Refund) -> tuple[Any, str]:
        about = f"of {refund.amount_cents} cents for order {refund.order.number}"
        return _refund_data(refund), about

    return desk_settlement("refund", operation_key, desk.refund_find(operation_key), described)


def _object(**properties: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties),
        "additionalProperties": False,
    }


class SupportDeskModel(ChatAgent, SupportDesk):
    """The support desk agent with a model for a planner: same tools, same inspector.

    Input as for ``support_desk``. The operation keys are named by the application, for
    this task's order only: a second request for the same refund meets the first, and a
    write about another order (or none) has no key and is refused before it runs.
    """

    name = "support_desk_model"
    title = "Support desk (a real model plans)"
    description = (
        "The support desk's refund and notice, planned by the model LOOPGUARD_MODEL_URL names."
    )
    default_limits: ClassVar[Mapping[str, Any]] = {
        "deadline_ms": 300_000,  # a real model takes seconds a call
        "model_calls": 12,
        "requests": 12,
        "executions": 6,
        "same": 2,
        "stagnant": 4,
    }
    tool_parameters: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "order_lookup": _object(order={"type": "integer"}),
        "refund": _object(order={"type": "integer"}, amount_cents={"type": "integer"}),
        "notify_customer": _object(
            order={"type": "integer"}, recipient={"type": "string"}, text={"type": "string"}
        ),
    }

    def tool_specs(self) -> Mapping[str, ToolSpec]:
        """The lookup reads; the refund and the notice are writes keyed by this order."""

        def this_order(key: str) -> Callable[[Mapping[str, Any]], str | None]:
            def name(args: Mapping[str, Any]) -> str | None:
                order = args.get("order")
                return key if type(order) is int and order == self.order else None

            return name

        return {
            "order_lookup": ToolSpec("read"),
            "refund": ToolSpec("write", this_order(self.refund_key)),
            "notify_customer": ToolSpec("write", this_order(self.notice_key)),
        }

    @classmethod
    def validate_input(cls, input: Mapping[str, Any]) -> None:
        """The support desk's input, and a configured model."""
        SupportDesk.validate_input(input)
        ChatAgent.validate_input(input)

    def instructions(self) -> str:
        """What the model is, and the rules it works by."""
        return (
            "You are a support agent with tools for the order desk. Look the order up first. "
            "Refund exactly the amount you are asked to, once. Then send the customer one "
            "short notice about the refund at the e-mail address the desk holds for the "
            "order. When both are done, reply with a one-sentence summary and no tool call."
        )

    def goal(self) -> str:
        """The task's input as the request the model works on."""
        return (
            f"Refund {self.amount_cents} cents on order {self.order} "
            f"(reason: {self.reason}) and notify the customer."
        )
