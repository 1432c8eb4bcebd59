"""Pieces the built-in agents share: a small input schema, the page reader, the notice tool.

Private to ``console.agents``: user agents implement :class:`~console.agents.base.Agent`
directly and owe nothing to these helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from console.agents.base import Tool
from console.demo import desk
from console.demo.models import Notice, OncePerKey, Order
from guard import Call, Kind, Result, Settlement

_REQUIRED: Any = object()


@dataclass(frozen=True, slots=True)
class Field:
    """One input field: its type, default (none: required), lower bound and allowed words."""

    kind: type[int] | type[str]
    default: Any = _REQUIRED
    minimum: int = 1
    maximum: int | None = None
    choices: tuple[str, ...] = ()


def check_input(fields: Mapping[str, Field], input: Any) -> dict[str, Any]:
    """``input`` with defaults filled in; raises ``ValueError`` saying what is wrong."""
    if not isinstance(input, Mapping):
        raise ValueError(f"input must be a JSON object, got {type(input).__name__}")
    unknown = sorted(str(name) for name in input if name not in fields)
    if unknown:
        allowed = ", ".join(fields) or "none"
        raise ValueError(f"unknown input field(s) {', '.join(unknown)}; allowed: {allowed}")
    values: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in input or input[name] is None:
            if field.default is _REQUIRED:
                raise ValueError(f"input needs {name!r} ({field.kind.__name__})")
            values[name] = field.default
            continue
        values[name] = _check_value(name, field, input[name])
    return values


def _check_value(name: str, field: Field, value: Any) -> Any:
    if field.kind is int:
        # bool is an int subclass, and JSON true is never a count.
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name!r} must be a whole number, got {value!r}")
        if value < field.minimum:
            raise ValueError(f"{name!r} must be at least {field.minimum}, got {value}")
        if field.maximum is not None and value > field.maximum:
            raise ValueError(f"{name!r} must be at most {field.maximum}, got {value}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name!r} must be a non-empty string, got {value!r}")
    if field.choices and value not in field.choices:
        raise ValueError(f"{name!r} must be one of {', '.join(field.choices)}, got {value!r}")
    return value


def succeeded(observation: Any) -> bool:
    """Whether a planner's observation is a single successful tool result."""
    return isinstance(observation, Result) and observation.kind == Kind.SUCCESS


# -- orders ---------------------------------------------------------------------------------


def order_tool() -> Tool:
    """``order_lookup`` (read): an order as the desk holds it, ``PRECONDITION`` if unknown."""

    def run(call: Call) -> Result:
        number = call.args.get("order")
        if not isinstance(number, int) or isinstance(number, bool):
            return Result(Kind.FATAL, {"error": f"order {number!r} is not an order number"})
        try:
            return Result(Kind.SUCCESS, order_data(desk.order_get(number)))
        except desk.OrderNotFound:
            return Result(Kind.PRECONDITION, {"missing": "order", "order": number})

    return Tool("order_lookup", "read", run, description="Read an order from the desk.")


def order_data(order: Order) -> dict[str, Any]:
    """What ``order_lookup`` reports for an order."""
    return {
        "order": order.number,
        "customer_email": order.customer_email,
        "amount_cents": order.amount_cents,
        "status": order.status,
    }


def order_confirmed(result: Result | None, number: int) -> bool:
    """Whether ``result`` is a lookup of order ``number`` that says what the desk holds."""
    if result is None or result.kind != Kind.SUCCESS or not isinstance(result.data, Mapping):
        return False
    try:
        return dict(result.data) == order_data(desk.order_get(number))
    except desk.OrderNotFound:
        return False


# -- pages ---------------------------------------------------------------------------------


def page_tool(*, before: Callable[[], None] | None = None, attempts: int = 1) -> Tool:
    """``read_page`` (read): one page of a desk collection, ``PRECONDITION`` if missing.

    ``before`` runs first on every call (the slow archive sleeps there).
    """

    def run(call: Call) -> Result:
        if before is not None:
            before()
        collection, number = call.args.get("collection"), call.args.get("page")
        if not isinstance(collection, str) or not isinstance(number, int):
            return Result(Kind.FATAL, {"error": "read_page needs a collection and a page"})
        page = desk.page_get(collection=collection, number=number)
        if page is None:
            return Result(
                Kind.PRECONDITION, {"missing": "page", "collection": collection, "page": number}
            )
        data = {"collection": collection, "page": number, "items": page.items}
        return Result(Kind.SUCCESS, data, attempts=attempts)

    return Tool("read_page", "read", run, description="Read one page of a desk collection.")


def page_call(collection: str, number: int) -> Call:
    """The ``read_page`` call for one page."""
    return Call("read_page", {"collection": collection, "page": number})


def verify_page(memory: dict[str, Any], result: Result | None, step: Call | Any) -> list[int]:
    """Add the page in ``result`` to ``memory['verified_pages']`` if the desk confirms it.

    A page counts only if the page asked for came back with exactly the items the desk
    holds: the tool's word (or the model's) is not enough. Returns the verified pages.
    """
    verified: list[int] = memory.setdefault("verified_pages", [])
    if result is None or result.kind != Kind.SUCCESS or not isinstance(step, Call):
        return verified
    data, args = result.data, step.args
    if not isinstance(data, Mapping) or step.tool != "read_page":
        return verified
    collection, number = args.get("collection"), args.get("page")
    if (data.get("collection"), data.get("page")) != (collection, number):
        return verified
    if not isinstance(collection, str) or not isinstance(number, int):
        return verified
    page = desk.page_get(collection=collection, number=number)
    if page is not None and page.items == data.get("items") and number not in verified:
        verified.append(number)
        verified.sort()
    return verified


# -- notices -------------------------------------------------------------------------------


def notice_call(*, key: str, recipient: str, text: str, order: int | None = None) -> Call:
    """A ``send_notice`` write under operation key ``key``."""
    args: dict[str, Any] = {"recipient": recipient, "text": text}
    if order is not None:
        args["order"] = order
    return Call("send_notice", args, "write", key)


def notice_tool(name: str = "send_notice", *, lose_response: bool = False) -> Tool:
    """A write that sends a desk notice under the call's operation key.

    The operation key is the desk's idempotency key, so the ledger and the business
    records name the same action. With ``lose_response`` the notice is sent and then the
    response is lost (``TimeoutError``), once per key: the desk remembers the fault.
    """

    def run(call: Call) -> Result:
        key = call.operation_key
        if not key:
            # Nothing was sent; the guard refuses such calls before they get here anyway.
            return Result(Kind.FATAL, {"error": "a notice needs an operation key"})
        order, recipient, text = (call.args.get(k) for k in ("order", "recipient", "text"))
        if not isinstance(recipient, str) or not isinstance(text, str):
            return Result(Kind.FATAL, {"error": "a notice needs a recipient and a text"})
        if order is not None and (not isinstance(order, int) or isinstance(order, bool)):
            return Result(Kind.FATAL, {"error": f"order {order!r} is not an order number"})
        try:
            notice = desk.notice_send(
                order_number=order, recipient=recipient, text=text, idempotency_key=key
            )
        except desk.OrderNotFound as error:
            return Result(Kind.PRECONDITION, {"missing": "order", "error": str(error)})
        except desk.IdempotencyConflict as error:
            return Result(Kind.FATAL, {"conflict": str(error)})
        if lose_response and desk.fault_trip_once(operation_key=key):
            raise TimeoutError(f"the desk sent notice {key} but its response was lost")
        return Result(Kind.SUCCESS, notice_data(notice))

    return Tool(
        name,
        "write",
        run,
        lookup=notice_settlement,
        description="Send a notice to a customer (once per operation key).",
    )


def notice_data(notice: Notice) -> dict[str, Any]:
    """What the notice tool reports for a sent notice."""
    return {
        "notice": notice.pk,
        "recipient": notice.recipient,
        "order": None if notice.order is None else notice.order.number,
    }


def notice_matches(call: Call) -> bool:
    """Whether the desk holds a notice under the call's key with exactly the call's input."""
    notice = desk.notice_find(call.operation_key or "")
    if notice is None:
        return False
    order = None if notice.order is None else notice.order.number
    return (order, notice.recipient, notice.text) == (
        call.args.get("order"),
        call.args.get("recipient"),
        call.args.get("text"),
    )


def desk_settlement[R: OncePerKey](
    what: str, operation_key: str, record: R | None, described: Callable[[R], tuple[Any, str]]
) -> Settlement:
    """Settle a write from the desk's record under its key (what a reconciler would check):
    none is not committed; one is committed, ``described`` giving its result and what it is
    (``to customers@example.com``)."""
    if record is None:
        return Settlement(False, evidence=f"the desk holds no {what} with key {operation_key}")
    data, about = described(record)
    at = f"{record.created_at:%Y-%m-%d %H:%M:%S %Z}"
    return Settlement(
        True, Result(Kind.SUCCESS, data), evidence=f"desk {what} #{record.pk} {about} at {at}"
    )


def notice_settlement(operation_key: str) -> Settlement:
    """Settle a notice write from the desk's records."""
    notice = desk.notice_find(operation_key)
    return desk_settlement(
        "notice", operation_key, notice, lambda n: (notice_data(n), f"to {n.recipient}")
    )
