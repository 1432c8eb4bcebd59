"""The console's guard, asked over HTTP: the Python client of the step protocol for attached
agents (``docs/protocol.md``, version 1), standard library only.

:class:`RemoteGuard` offers the step-wise interface of the local :class:`guard.Guard`
(:class:`guard.steps.StepGuard`), so ``guard.contrib.langchain.LoopGuardMiddleware`` and
``guard.contrib.openai_agents.GuardedRun`` take it unchanged; every decision is the console's::

    from guard.contrib.langchain import LoopGuardMiddleware
    from guard.remote import RemoteGuard

    with RemoteGuard.start("https://console.example", token=token, agent="support-bot",
                           tools=specs, client="support-service/3") as guard:
        middleware = LoopGuardMiddleware(guard, specs)
        ...                                       # create_agent(..., middleware=[middleware])
        print(guard.page_url)                     # the task's page on the console

What it promises:

- **Fail closed.** A step that gets no answer is sent again, then raises
  :exc:`ConsoleUnreachable`; a refusal raises :exc:`ProtocolError`. Neither ever comes back
  as an allow: ``before_tool`` returns ``EXECUTE`` only when the console said so, so a tool
  never runs on a console that cannot be reached.
- **Retries are the same request.** A connection error, a timeout, a 5xx or a 429 is retried
  ``retries`` times (backoff 0.1 s, 0.3 s, 0.9 s, … at most 2 s) with the same body and the
  same ``request_id``: the console answers a request it has already seen with its stored
  answer and never claims twice. A 503 or 429 with ``Retry-After`` (seconds) waits that long
  instead, never less than the backoff, at most 30 s. A step the caller asks again after
  :exc:`ConsoleUnreachable`, with the same content, is sent with that request id too.
- **One connection.** Requests go over one kept-alive connection (HTTP/1.1); one the
  console closed while idle is opened again and the request sent once more, with its own
  request id. ``before_tools(proposal, enter=True)`` (a host that runs a one-call
  proposal's call at once) has the call's entry decided in the admission's request: a
  step is then two requests, not three.
- **Usage rides along.** ``spend_tokens`` and ``settle_spend`` make no request: they are
  sent as the next step's ``usage``, and kept until a step carrying them is answered (an
  answer that was lost may have charged them already; a budget is never under-counted).
- **The lease is kept alive.** A daemon thread sends a ``heartbeat`` every third of the
  lease while nothing else is sent (a long tool, a slow model); a heartbeat that fails is
  logged and tried again at the next beat, and the console's ``stop_requested`` is kept
  (:attr:`RemoteGuard.stop_requested`). It stops at :meth:`RemoteGuard.close` and once the
  task has stopped.
- **Terminal is sticky.** Once an answer carries the stop report, every step returns it
  without asking the console again.

- **It comes back.** :meth:`RemoteGuard.attach` (or :meth:`RemoteGuard.start` with the
  same ``start_id``) from a new process takes the task over after its predecessor died at
  any step: it waits out the dead lease, then reports the calls left running — a write
  with what ``lookups[tool]`` (the tool's trusted lookup) finds, which settles it.
- **Approval is asked at start.** ``RemoteGuard.start(..., approval=["refund"])``: a call
  to one of those tools stops the task ``NEEDS_HUMAN``/``approval_required`` (its report's
  ``pending`` the call), and nothing runs; once a person approved it, :meth:`attach`
  takes the resumed task and the same call proposed again is admitted, once.

What protocol 1 does not offer, and so this client does not either: a tool's ``lookup`` on
its own calls (``before_tool``/``after_tool`` accept ``lookup=`` and ignore it: a lookup
is asked only about a write a lost predecessor left running, above); the summary turn;
``checkpoint``/``restore`` (a new process continues a task with :meth:`RemoteGuard.attach`);
and an in-process ``cancel`` (an operator presses Stop on the console).
"""

from __future__ import annotations

from ._guard import RemoteGuard
from ._transport import ConsoleUnreachable, ProtocolError
from ._wire import DEFAULT_CLIENT as DEFAULT_CLIENT
from ._wire import MAX_CALLS as MAX_CALLS
from ._wire import PROTOCOL as PROTOCOL

__all__ = ["ConsoleUnreachable", "ProtocolError", "RemoteGuard"]

# The parts (one job each: _transport.py the HTTP, _wire.py the protocol's values,
# _session.py one task's conversation, _heartbeat.py the lease kept alive, _coming_back.py
# start, attach and the take-over, _guard.py the steps) are private: the public names live
# here, in a traceback and in a pickle too, as they did before the client was split.
for _public in (ConsoleUnreachable, ProtocolError, RemoteGuard):
    _public.__module__ = __name__
del _public
