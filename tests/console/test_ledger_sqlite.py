"""In standalone mode (SQLite) a claim is still atomic: of eight processes, one wins each key.

The same race as test_ledger_db.py's, on a SQLite file in WAL mode with IMMEDIATE
transactions (console/project/settings.py): eight OS processes, each its own connection and its
own task, claim the same fresh keys, and keys settled NOT_COMMITTED, at the same moments.
Every process runs with ``LOOPGUARD_STANDALONE=1``; nothing here touches PostgreSQL. The
history tables' append-only triggers are checked here too, after all migrations.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.processes import start_python
from tests.waiting import CLAIMER, release_together, standalone_env

pytestmark = pytest.mark.slow

PROCESSES = 8
FRESH_KEYS = [f"race-fresh-{n}" for n in range(30)]
RETRY_KEYS = [f"race-retry-{n}" for n in range(10)]
SLOT_S = 0.05
FP = "f" * 64

# Migrates, makes one running task per racer plus one whose keys are settled NOT_COMMITTED,
# and prints the racers' task ids and lease owners.
SETUP = """
import json, sys
from datetime import timedelta
import django
django.setup()
from django.core.management import call_command
from django.utils import timezone
from console.drivers.ledger import DatabaseLedger
from console.models import Task
call_command("migrate", verbosity=0)
processes, fingerprint, retry_keys = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
def running(owner):
    return Task.objects.create(agent="test_notices", input_fingerprint="t", limits={},
        state="RUNNING", lease_owner=owner,
        lease_expires_at=timezone.now() + timedelta(minutes=5))
earlier = running("earlier:0:0000")
settle = DatabaseLedger(task_id=earlier.id, owner=earlier.lease_owner)
for key in retry_keys:
    settle.claim(key, fingerprint)
    settle.resolve(key, committed=False, evidence="verified: nothing was sent")
racers = [running(f"racer-{n}:{n}:{n:04}") for n in range(processes)]
print(json.dumps([[t.id, t.lease_owner] for t in racers]))
"""


def test_of_eight_processes_claiming_each_key_at_once_on_sqlite_exactly_one_wins(
    tmp_path: Path,
) -> None:
    env = standalone_env(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    setup = start_python(SETUP, str(PROCESSES), FP, json.dumps(RETRY_KEYS), env=env)
    out, err = setup.communicate(timeout=120)
    assert setup.returncode == 0, err
    racers = json.loads(out.strip().splitlines()[-1])
    keys = FRESH_KEYS + RETRY_KEYS

    processes = [
        start_python(CLAIMER, str(task_id), owner, FP, str(SLOT_S), json.dumps(keys), env=env)
        for task_id, owner in racers
    ]
    answers = release_together(processes, delay=0.3, timeout=60)
    for key in keys:
        seen = sorted(answer[key] for answer in answers)
        assert seen == ["claimed"] + ["in_flight"] * (PROCESSES - 1), (key, seen)

    with sqlite3.connect(tmp_path / "loopguard.sqlite3") as db:
        rows = {
            key: (state, task_id, attempts)
            for key, state, task_id, attempts in db.execute(
                "SELECT key, state, task_id, attempts FROM console_operation "
                "WHERE key LIKE 'race-%'"
            )
        }
        claims = dict(
            db.execute(
                "SELECT o.key, count(*) FROM console_operationevent e "
                "JOIN console_operation o ON o.id = e.operation_id "
                "WHERE e.to_state = 'IN_FLIGHT' GROUP BY o.key"
            ).fetchall()
        )
    assert sorted(rows) == sorted(keys)
    for key in keys:
        winner = next(n for n, answer in enumerate(answers) if answer[key] == "claimed")
        retried = key in RETRY_KEYS
        assert rows[key] == ("IN_FLIGHT", racers[winner][0], 2 if retried else 1), key
        assert claims[key] == (2 if retried else 1), key


MIGRATE = """
import django
django.setup()
from django.core.management import call_command
from console.models import StopReport, Task
call_command("migrate", verbosity=0)
task = Task.objects.create(agent="paging", input_fingerprint="f", limits={})
StopReport.objects.create(task=task, phase=1, state="CANCELLED", reason="operator_stop",
                          report={})
"""
HISTORY = [
    "console_traceevent",
    "console_operationevent",
    "console_stopreport",
    "console_auditentry",
]


def test_after_every_migration_sqlite_history_tables_still_refuse_update_and_delete(
    tmp_path: Path,
) -> None:
    # SQLite rebuilds a table to alter it, which drops its triggers: a later migration
    # that rebuilds a history table must put them back (as 0008 does).
    migrate = start_python(MIGRATE, env=standalone_env(tmp_path))
    _, err = migrate.communicate(timeout=120)
    assert migrate.returncode == 0, err

    with sqlite3.connect(tmp_path / "loopguard.sqlite3") as db:
        found = db.execute("SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger'")
        triggers = set(found)
        assert triggers == {
            (table, f"{table}_append_only_{op}") for table in HISTORY for op in ("update", "delete")
        }
        for statement in (
            "UPDATE console_stopreport SET reason = 'x'",
            "DELETE FROM console_stopreport",
        ):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                db.execute(statement)


# Drives tasks on SQLite with the runner, as the standalone console does: reads, writes
# (one of them lost and settled by its lookup), and a stop recorded while the model thinks
# about a write, which the claim carrying the model call's save must see.
DRIVE = """
import json
import django
django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from console import services
from console.drivers import runner
from console.models import Operation, Task, TraceEvent
from tests.console.agents import NoticeWriter
call_command("migrate", verbosity=0)
operator = User.objects.create_user("olga")
def start(agent, input):
    return services.task_start(agent=agent, input=input, enqueue=lambda task_id: None)
def seen(task):
    task.refresh_from_db()
    events = TraceEvent.objects.filter(task=task).order_by("seq")
    kinds = list(events.values_list("kind", "decision"))
    ops = sorted(Operation.objects.filter(task=task).values_list("state", flat=True))
    return {"end": [task.state, task.reason], "counted": [task.model_calls, task.executions],
            "trace": kinds, "operations": ops}
out = {}
reads, writes = start("test_reader", {"pages": 3}), start("test_notices", {"count": 3, "lose": 2})
out["reads"] = [runner.drive(reads.id), seen(reads)]
out["writes"] = [runner.drive(writes.id), seen(writes)]
real_plan = NoticeWriter.plan
def plan_then_stop(self, observation):
    proposal = real_plan(self, observation)
    if getattr(proposal, "operation_key", "").endswith("-notice-2"):
        services.task_stop(task_id=self.task_id, actor=operator, reason="stop it")
    return proposal
NoticeWriter.plan = plan_then_stop
stopped = start("test_notices", {"count": 3})
out["stopped"] = [runner.drive(stopped.id), seen(stopped)]
NoticeWriter.plan = real_plan
# A stop pressed after the runner's last look, just before the write's claim: the claim's
# own transaction sees it and answers "stopping".
from console.demo.models import Notice
from console.store.sqlite import SqliteStore
real_claim, answers = SqliteStore.claim, []
def stop_then_claim(self, key, *args, **kw):
    services.task_stop(task_id=self.task_id, actor=operator, reason="stop it now")
    claim = real_claim(self, key, *args, **kw)
    answers.append(str(claim.status))
    return claim
SqliteStore.claim = stop_then_claim
at_claim = start("test_notices", {"count": 2})
out["at_claim"] = [runner.drive(at_claim.id), seen(at_claim), answers,
                   Notice.objects.filter(idempotency_key__startswith=f"task-{at_claim.id}-").count()]
print(json.dumps(out))
"""


def test_on_sqlite_the_runner_saves_every_step_and_a_claim_sees_a_stop_recorded_meanwhile(
    tmp_path: Path,
) -> None:
    drive = start_python(DRIVE, env=standalone_env(tmp_path))
    out, err = drive.communicate(timeout=180)
    assert drive.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])

    outcome, reads = seen["reads"]
    assert outcome == "COMPLETED/goal_met"
    assert reads["counted"] == [3, 3]
    assert reads["trace"] == [["model_call", "planned"], ["request", "executed"]] * 3 + [
        ["stop", ""]
    ]
    outcome, writes = seen["writes"]
    assert outcome == "COMPLETED/goal_met"
    assert writes["counted"][1] == 3
    assert writes["operations"] == ["COMMITTED"] * 3  # the lost one settled by its lookup
    outcome, stopped = seen["stopped"]
    assert stopped["end"] == ["CANCELLED", "operator_stop"]
    assert stopped["counted"][1] == 1
    assert stopped["operations"] == ["COMMITTED"]
    # The model call that proposed the refused write is in the trace, before the stop.
    assert stopped["trace"][-3:] == [
        ["model_call", "planned"],
        ["request", "blocked"],
        ["stop", ""],
    ]
    outcome, at_claim, answers, sent = seen["at_claim"]
    assert outcome == "CANCELLED/operator_stop"
    assert answers == ["stopping"]  # the claim saw the stop pressed after the last look
    assert at_claim["end"] == ["CANCELLED", "operator_stop"]
    assert (at_claim["counted"][1], at_claim["operations"], sent) == (0, [], 0)


# The SQLite twin of test_runner.py's cut-off save: right after the first notice is sent,
# another connection holds the database's write lock for a while, so the save carrying
# the write's record fails with "database is locked" (its connection waits 100 ms, as a
# busy standalone console might). The driver must make the record on its own before it
# gives up, so that recovery resumes the task instead of sending it to a human.
LOCKED = """
import json, sqlite3, threading, time
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.utils import timezone
from datetime import timedelta
from console import services
from console.drivers import runner
from console.demo.models import Notice
from console.models import Operation, Task
from tests.console.agents import NoticeWriter
call_command("migrate", verbosity=0)
task = services.task_start(agent="test_notices", input={"count": 2}, enqueue=lambda i: None)
locker_done = threading.Event()
def hold_the_write_lock(taken):
    db = sqlite3.connect(settings.DATABASES["default"]["NAME"], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    taken.set()
    time.sleep(1.5)
    db.execute("ROLLBACK")
    db.close()
    locker_done.set()
real_send = NoticeWriter._send
def send_then_lock(self, call):
    result = real_send(self, call)
    if not locker_done.is_set() and not hasattr(send_then_lock, "locked"):
        send_then_lock.locked = True
        taken = threading.Event()
        threading.Thread(target=hold_the_write_lock, args=(taken,)).start()
        taken.wait()
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 100")
    return result
NoticeWriter._send = send_then_lock
out = {}
try:
    runner.drive(task.id)
except DatabaseError as exc:
    out["error"] = str(exc)
locker_done.wait(10)
connection.close()
out["first"] = Operation.objects.get(key=f"task-{task.id}-notice-1").state
Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
out["resumed"] = runner.sweep(enqueue=lambda i: None)["resumed"]
runner.drive(task.id)
task.refresh_from_db()
out["end"] = [task.state, task.reason, task.recoveries]
out["notices"] = Notice.objects.filter(idempotency_key__startswith=f"task-{task.id}-").count()
print(json.dumps(out))
"""


def test_on_sqlite_a_verified_write_whose_save_finds_the_database_locked_is_still_recorded(
    tmp_path: Path,
) -> None:
    drive = start_python(LOCKED, env=standalone_env(tmp_path))
    out, err = drive.communicate(timeout=180)
    assert drive.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])

    assert seen["error"] == "database is locked"
    assert seen["first"] == "COMMITTED"
    assert seen["resumed"] == 1
    assert seen["end"] == ["COMPLETED", "goal_met", 1]
    assert seen["notices"] == 2


# A claim carrying the model call's save, whose transaction then fails (here: the claim's
# history row is refused by a trigger, as a full disk would refuse it): the carried step
# was not saved, so the driver must keep its events and send them again.
ROLLED_BACK = """
import json
import django
django.setup()
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.utils import timezone
from console import services
from console.models import Operation, Task, TraceEvent
from console.store import Step, open_store
call_command("migrate", verbosity=0)
task = services.task_start(agent="test_notices", input={"count": 1}, enqueue=lambda i: None)
store = open_store(task.id, "driver")
store.take_lease(30)
usage = {"model_calls": 1, "requests": 1, "executions": 1, "tokens": 0, "spend": 0,
         "explored": 0, "polls": 0, "elapsed_ms": 0}
def model_call():
    return {"kind": "model_call", "at": timezone.now(), "decision": "planned"}
with connection.cursor() as cursor:
    cursor.execute("CREATE TRIGGER refuse_claims BEFORE INSERT ON console_operationevent "
                   "BEGIN SELECT RAISE(ABORT, 'disk full'); END")
carried = Step(usage, 0, [model_call()])
out = {}
try:
    store.claim("k-1", "f" * 64, tool="send_notice", args="{}", carry=carried)
except DatabaseError as exc:
    out["error"] = str(exc)
with connection.cursor() as cursor:
    cursor.execute("DROP TRIGGER refuse_claims")
out["carried_saved"] = carried.saved is not None
out["claimed"] = Operation.objects.filter(key="k-1").exists()
store.save(Step(usage, 0, [model_call()]))  # the driver's events, still pending, go again
task.refresh_from_db()
out["trace"] = list(TraceEvent.objects.filter(task=task).values_list("seq", "kind"))
out["next_seq"] = task.next_seq
print(json.dumps(out))
"""


def test_on_sqlite_a_claim_that_rolls_back_leaves_its_carried_step_unsaved(tmp_path: Path) -> None:
    run = start_python(ROLLED_BACK, env=standalone_env(tmp_path))
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])

    assert seen["error"] == "disk full"
    assert (seen["carried_saved"], seen["claimed"]) == (False, False)
    assert seen["trace"] == [[1, "model_call"]]
    assert seen["next_seq"] == 2


# An attached agent's steps on SQLite: the step store's ORM path (the task row read with
# the step, the answer stored with it) in place of PostgreSQL's statements.
ATTACHED = """
import json
import django
django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from console.drivers import attached
from console.models import Operation, StepRequest
call_command("migrate", verbosity=0)
user = User.objects.create_user("bot")
lease = "bot:1:0001"
limits = {"deadline_ms": 600000, "model_calls": 8, "requests": 8, "executions": 6}
answer, _ = attached.attached_start(actor=user, request_id="s", lease=lease, agent="bot",
    client="tests", tools={"refund": "write"}, limits=limits, fingerprint="s")
task = answer["task"]
def step(name, request_id, **fields):
    return attached.attached_step(actor=user, task_id=task, request_id=request_id, lease=lease,
        step=name, fields=fields, fingerprint=attached.body_hash({"step": name, **fields}))
out = {}
step("model", "m-1")
refund = {"tool": "refund", "args": {"n": 1}, "operation_key": "k-1"}
first = step("tools", "t-1", calls=[refund], enter=True)
out["again"] = step("tools", "t-1", calls=[refund], enter=True) == first
out["action"] = first.get("action")
op = Operation.objects.get(key="k-1")
out["claimed"] = [op.state, op.attempts]
result = {"kind": "SUCCESS", "data": {"refund": 1}}
out["allowed"] = step("result", "r-1", ticket=0, result=result, then="model").get("allowed")
lost = {"tool": "refund", "args": {"n": 2}, "operation_key": "k-2"}
step("tools", "t-2", calls=[lost], enter=True)
error = {"type": "TimeoutError", "message": "lost", "transient": False}
stop = step("result", "r-2", ticket=0, error=error)["stop"]
out["stop"] = [stop["state"], [[o["key"], o["state"]] for o in stop["operations"]]]
out["answers"] = StepRequest.objects.filter(task_id=task).exclude(step="start").count()
print(json.dumps(out))
"""


def test_on_sqlite_an_attached_agents_steps_claim_once_and_report_every_write(
    tmp_path: Path,
) -> None:
    steps = start_python(ATTACHED, env=standalone_env(tmp_path))
    out, err = steps.communicate(timeout=180)
    assert steps.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])

    assert seen["again"] is True  # a retried request: the same answer, no second claim
    assert seen["action"] == "execute" and seen["claimed"] == ["IN_FLIGHT", 1]
    assert seen["allowed"] is True
    assert seen["stop"] == ["NEEDS_HUMAN", [["k-1", "COMMITTED"], ["k-2", "UNKNOWN"]]]
    assert seen["answers"] == 5  # model, tools, result, tools, result: each stored once
