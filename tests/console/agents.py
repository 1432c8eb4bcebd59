"""Agents that exist for the runner's tests: small, deterministic, slow on request."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from console.agents import Agent, Tool
from console.demo import desk
from console.demo.models import Notice
from guard import Call, Evidence, Finish, Kind, Result, Settlement
from tests.databases import cut_own_session


def _sleep(ms: Any) -> None:
    if ms:
        time.sleep(float(ms) / 1000.0)


class DeskNotices(Agent):
    """What the notice agents share: their one tool, ``send_notice``, a write held for a
    person's approval when its key ends in ``-notice-<approve>``, whose lost response is
    settled by looking the notice up in the desk (``{"auto_lookup": false}``: by a human)."""

    def __init__(self, task_id: int, input: Mapping[str, Any], memory: dict[str, Any]) -> None:
        super().__init__(task_id, input, memory)
        self.auto_lookup = bool(input.get("auto_lookup", True))

    def tools(self) -> Sequence[Tool]:
        held = f"-notice-{self.input.get('approve')}"
        return [
            Tool(
                "send_notice",
                "write",
                self._send,
                lookup=self._lookup,
                approval=lambda call: str(call.operation_key).endswith(held),
            )
        ]

    @abstractmethod
    def _send(self, call: Call) -> Result:
        """Send the notice ``call`` asks for."""

    def _lookup(self, key: str) -> Settlement:
        return Settlement(committed=Notice.objects.filter(idempotency_key=key).exists())


class NoticeWriter(DeskNotices):
    """Sends ``count`` notices one after another, each a write with its own key.

    ``sleep_ms`` is spent inside the tool *after* the notice is committed, so a process
    killed then leaves a committed action whose response never came back. With ``cut``:
    n, the first send of notice n finds its database session killed. With ``batch``, all
    the notices left are asked for at once; with ``approve``: n, notice n needs a person's
    approval. What each model call observed (kinds of the results) is kept in memory.
    """

    name = "test_notices"
    title = "Notice writer (tests)"

    def _key(self, n: int) -> str:
        return f"{self.input.get('prefix', 'task')}-{self.task_id}-notice-{n}"

    def _send(self, call: Call) -> Result:
        key = str(call.operation_key)
        if key.endswith(f"-notice-{self.input.get('cut')}") and desk.fault_trip_once(
            operation_key=f"{key}#cut"
        ):
            cut_own_session()  # the send below meets a database that went away
        desk.notice_send(
            order_number=None,
            recipient="ops@example.com",
            text=str(call.args["text"]),
            idempotency_key=str(call.operation_key),
        )
        _sleep(self.input.get("sleep_ms"))
        key = str(call.operation_key)
        if key.endswith(f"-notice-{self.input.get('lose')}") and desk.fault_trip_once(
            operation_key=key
        ):
            raise TimeoutError("the notice was sent but its response was lost")
        return Result(Kind.SUCCESS, {"sent": call.operation_key})

    def _sent(self) -> int:
        keys = [self._key(n) for n in range(1, int(self.input.get("count", 1)) + 1)]
        return Notice.objects.filter(idempotency_key__in=keys).count()

    def plan(self, observation: Any) -> Call | list[Call] | Finish:
        seen = observation if isinstance(observation, list) else [observation]
        self.memory.setdefault("observed", []).append(
            [getattr(item, "kind", type(item).__name__) for item in seen]
        )
        sent, count = self._sent(), int(self.input.get("count", 1))
        if sent >= count:
            return Finish("all sent")
        calls = [
            Call("send_notice", {"text": f"notice {n}"}, "write", self._key(n))
            for n in range(sent + 1, count + 1)
        ]
        return calls if self.input.get("batch") else calls[0]

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        sent = self._sent()
        committed = None
        if isinstance(step, Call):
            committed = Notice.objects.filter(idempotency_key=step.operation_key).exists()
        return Evidence(sent, sent >= int(self.input.get("count", 1)), committed)


class SharedNotice(DeskNotices):
    """Asks for one notice under the operation key ``key``, which other tasks may share,
    until its own request for it came back ``SUCCESS`` (whoever ran it). ``hold_ms`` is
    spent inside the tool *before* the notice is sent: the operation is ``IN_FLIGHT`` all
    that time, and the desk has nothing yet. With ``lose``, the first send's response is
    lost (the notice is sent)."""

    name = "test_shared_notice"
    title = "Shared notice (tests)"

    def _send(self, call: Call) -> Result:
        _sleep(self.input.get("hold_ms"))
        desk.notice_send(
            order_number=None,
            recipient="ops@example.com",
            text="shared notice",
            idempotency_key=str(call.operation_key),
        )
        key = str(call.operation_key)
        if self.input.get("lose") and desk.fault_trip_once(operation_key=key):
            raise TimeoutError("the notice was sent but its response was lost")
        return Result(Kind.SUCCESS, {"sent": call.operation_key, "by": self.task_id})

    def plan(self, observation: Any) -> Call | Finish:
        if self.memory.get("done"):
            return Finish("sent")
        return Call("send_notice", {"text": "shared notice"}, "write", str(self.input["key"]))

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        if isinstance(step, Call) and result is not None and result.kind == Kind.SUCCESS:
            self.memory["done"] = True
        done = bool(self.memory.get("done"))
        committed = None
        if isinstance(step, Call):
            committed = Notice.objects.filter(idempotency_key=step.operation_key).exists()
        return Evidence(int(done), done and isinstance(step, Finish), committed)


class SlowReader(Agent):
    """Reads ``pages`` pages, ``sleep_ms`` inside each read (``think_ms`` in each model call,
    which reports ``tokens``, 10 by default); progress is kept in memory."""

    name = "test_reader"
    title = "Slow reader (tests)"

    def tools(self) -> Sequence[Tool]:
        return [Tool("read_page", "read", self._read)]

    def _read(self, call: Call) -> Result:
        _sleep(self.input.get("sleep_ms"))
        page = int(call.args["page"])
        return Result(Kind.SUCCESS, {"page": page, "items": [f"item-{page}"]})

    def plan(self, observation: Any) -> Call | Finish:
        _sleep(self.input.get("think_ms"))  # a model that takes its time
        self.tokens = int(self.input.get("tokens", 10))
        return Call("read_page", {"page": int(self.memory.get("read", 0)) + 1})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        read = int(self.memory.get("read", 0))
        if result is not None and isinstance(step, Call):
            data: Mapping[str, Any] = result.data or {}
            if data.get("page") == read + 1 and data.get("items") == [f"item-{read + 1}"]:
                read += 1
                self.memory["read"] = read
        return Evidence(read, read >= int(self.input.get("pages", 3)))


class Waiter(Agent):
    """Polls a job that stays ``PENDING``, asking to wait ``wait_ms`` each time."""

    name = "test_waiter"
    title = "Waiter (tests)"

    def tools(self) -> Sequence[Tool]:
        return [Tool("job_status", "read", self._status)]

    def _status(self, call: Call) -> Result:
        self.memory["polls"] = int(self.memory.get("polls", 0)) + 1
        return Result(Kind.PENDING, {"job": 1}, wait_ms=int(self.input.get("wait_ms", 5000)))

    def plan(self, observation: Any) -> Call:
        return Call("job_status", {"job": 1})

    def inspect(self, result: Result | None, step: Call | Finish) -> Evidence:
        return Evidence(0, False)
