"""An attached agent process for the live tests: a plain loop over ``guard.remote``.

Run as ``python -m tests.console.attached_agent <scenario> --url … --token … --record FILE``
(``--task N`` continues a task instead of starting one; ``--lookup`` then gives ``notify``
its trusted lookup, which reads the record, for a write its predecessor left running;
``--die-after STEP`` ends the process right after that step's answer, without a word). Its
one tool, ``notify``, is a write whose business system has no idempotency of its own: each
execution appends one line to ``--record`` (the notices "sent"), so a duplicate would show
as a second line. Only the guard's ledger stands between a retry and a second notice.

Scenarios (what the tool does once it runs):

- ``send``: sends, answers ``SUCCESS``; asks again while the answer is ``PENDING``
  (another process holds the key), then finishes;
- ``lose``: sends, then raises ``ConnectionError`` (the response is lost);
- ``hang``: sends, then never answers (the test kills the process).

Prints one JSON line at the end: the actions it was given, and the stop report's state and
reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from guard import Call, Finish, Kind, Nudge, Report, Result, Settlement
from guard.remote import RemoteGuard
from guard.steps import Action

KEY = "incident-7-first-notice"
CALL = Call("notify", {"incident": 7, "text": "Database down"}, "write", KEY)


def notice(incident: int) -> Call:
    """The first notice of ``incident`` (7: :data:`CALL`), each incident its own key."""
    if incident == 7:
        return CALL
    text = f"Database down #{incident}"
    key = f"incident-{incident}-first-notice"
    return Call("notify", {"incident": incident, "text": text}, "write", key)
LIMITS = {"deadline_ms": 120_000, "model_calls": 8, "requests": 8, "executions": 6, "same": 4}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["send", "lose", "hang"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--task", type=int)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds the send takes")
    parser.add_argument("--lookup", action="store_true", help="notify's lookup reads the record")
    parser.add_argument("--incident", type=int, default=7, help="whose first notice it sends")
    parser.add_argument("--start-id", help="the start's id: a start asked again finds its task")
    parser.add_argument(
        "--die-after",
        choices=["model", "tools", "call", "result", "wait"],
        help="the process dies (no goodbye, no heartbeat) right after this step's first answer",
    )
    options = parser.parse_args(argv)
    call = notice(options.incident)

    def step(name: str) -> None:
        if options.die_after == name:
            os._exit(9)

    def lookup(key: str) -> Settlement:
        """The business system's own answer: is there a notice for this task's incident?"""
        lines = options.record.read_text().splitlines()
        if any(line.endswith(call.args["text"]) for line in lines):
            result = Result(Kind.SUCCESS, {"notice": f"sent for incident {call.args['incident']}"})
            return Settlement(True, result, f"a notice line for {key} is in the record")
        return Settlement(False, None, f"no notice line for {key} in the record")

    if options.task:
        lookups = {"notify": lookup} if options.lookup else None
        guard = RemoteGuard.attach(
            options.url, token=options.token, task=options.task, lookups=lookups
        )
    else:
        guard = RemoteGuard.start(
            options.url,
            token=options.token,
            agent="notifier",
            client="tests.console.attached_agent",
            tools={"notify": "write"},
            input={"incident": options.incident},  # each incident its own goal
            start_id=options.start_id,
            lookups={"notify": lookup} if options.lookup else None,
            limits=LIMITS,
        )
    print(json.dumps({"task": guard.task}), flush=True)  # the test may wait for this line

    def notify() -> Result:
        with options.record.open("a") as record:
            record.write(f"{guard.task} {call.args['text']}\n")
        time.sleep(options.hold)
        if options.scenario == "lose":
            raise ConnectionError("the notice service did not answer")
        if options.scenario == "hang":
            time.sleep(3600)
        return Result(Kind.SUCCESS, {"notice": f"sent for incident {call.args['incident']}"})

    actions: list[str] = []
    report: Report | None = None
    with guard:
        while report is None:
            if (stop := guard.before_model()) is not None:
                report = stop
                break
            step("model")
            admitted = guard.before_tools(call)
            step("tools")
            if isinstance(admitted, Report):
                report = admitted
                break
            if isinstance(admitted, Nudge):
                continue
            (ticket,) = admitted
            decision = guard.before_tool(ticket)
            step("call")
            actions.append(str(decision.action))
            if decision.action is Action.STOP:
                report = decision.report
                break
            if decision.action is Action.EXECUTE:
                try:
                    outcome = notify()
                except ConnectionError as exc:
                    report = guard.after_tool(ticket, error=exc, inspect=None)
                    continue
                report = guard.after_tool(ticket, outcome, inspect=None)
                step("result")
            else:
                report = guard.after_tool(ticket, inspect=None)
            if report is not None:
                break
            pause = guard.before_wait()
            step("wait")
            if isinstance(pause, Report):
                report = pause
                break
            reused = decision.result
            if reused is not None and reused.kind is Kind.PENDING:
                time.sleep((pause or 0) / 1000)
                continue  # another process holds the key: ask again
            # The model's next answer is the finish: a model call of its own.
            report = guard.before_model() or guard.finish(Finish("notified"), inspect=None)
    outcome: dict[str, Any] = {"task": guard.task, "actions": actions}
    outcome |= {"state": str(report.state), "reason": str(report.reason)}
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
