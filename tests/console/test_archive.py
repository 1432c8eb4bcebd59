"""Archives of the trace (PostgreSQL): a closed partition of finished tasks written to a file,
checked against the database, and only then dropped; brought back with every row and id;
nothing unfinished ever archived; the task page of an archived task still tells its story."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import re
import subprocess
from collections.abc import Callable
from datetime import datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django import Settings

from console import services
from console import tasks as beat_tasks
from console.drivers import archive as trace_archive
from console.drivers.archive import ArchiveRefused
from console.models import Operation, Task, TaskState, TraceArchive, TraceEvent
from console.records.roles import Role, assign
from console.store import history
from tests.console.views.support import finish
from tests.processes import ROOT, clean_environment, run_python

pytestmark = pytest.mark.django_db

SIZE = 10  # task ids to a range: a few tasks fill one


@dataclasses.dataclass
class Ranges:
    """Small ranges made ahead of every existing one: ``low`` is the first, closed once a
    task of the next range exists (:meth:`close`)."""

    low: int

    @property
    def name(self) -> str:
        return f"console_traceevent_t{self.low}"

    @property
    def next_name(self) -> str:
        return f"console_traceevent_t{self.low + SIZE}"

    def close(self) -> Task:
        """A task in the next range: no new task can take an id in the first any more."""
        return _task(self.low + SIZE, state=TaskState.QUEUED)


@pytest.fixture
def ranges(settings: Settings) -> Ranges:
    settings.LOOPGUARD_TRACE_PARTITION_TASKS = SIZE
    top = max(p.high or 0 for p in history.trace_partitions() if not p.default)
    _task(top, events=0)  # the newest task: the ranges are made ahead of it
    made = history.partitions_ahead()
    assert f"console_traceevent_t{top}" in made
    return Ranges(top)


@pytest.fixture
def checked() -> Callable[[], None]:
    """Check now the foreign keys of the rows this test wrote, as their commit would: a
    partition with checks pending in the transaction cannot be detached, and a test's
    transaction never commits."""

    def check() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")

    return check


LONG_AGO = datetime(2020, 1, 15, tzinfo=timezone.get_current_timezone())


def _task(
    task_id: int,
    *,
    state: str = TaskState.COMPLETED,
    events: int = 3,
    finished: datetime = LONG_AGO,
) -> Task:
    terminal = state not in (TaskState.QUEUED, TaskState.RUNNING)
    reasons = {TaskState.COMPLETED: "goal_met", TaskState.NEEDS_HUMAN: "unknown_commit"}
    task = Task.objects.create(
        id=task_id,
        agent="test_reader",
        input={"n": task_id},
        limits={},
        state=state,
        reason=reasons.get(state, "no_progress") if terminal else "",
        finished_at=finished if terminal else None,
        updated_at=finished,
        created_at=finished,
        next_seq=events + 1,
    )
    TraceEvent.objects.bulk_create(
        TraceEvent(
            task=task,
            phase=1,
            seq=seq,
            at=finished - timedelta(seconds=seq),
            kind="request",
            decision="executed",
            tool="read_page",
            args_preview=json.dumps({"page": seq, "text": 'ünïcode "quoted"\n'}),
            result_kind="SUCCESS",
            revision=seq,
            latency_ms=seq * 7,
            detail=f"task {task_id} event {seq}",
        )
        for seq in range(1, events + 1)
    )
    return task


def _rows(low: int, high: int) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM console_traceevent WHERE task_id >= %s AND task_id < %s ORDER BY id",
            [low, high],
        )
        return [tuple(row) for row in cursor.fetchall()]


def _columns() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM console_traceevent LIMIT 0")
        return [column.name for column in cursor.description]


def _names() -> list[str]:
    return [p.name for p in history.trace_partitions()]


def _before() -> datetime:
    return timezone.now() + timedelta(days=1)


def test_an_archived_partition_comes_back_with_every_row_and_id_as_it_was(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    first, second = _task(ranges.low + 1), _task(ranges.low + 2, events=5)
    ranges.close()
    before = _rows(ranges.low, ranges.low + SIZE)
    assert len(before) == 8
    checked()

    outcome = trace_archive.archive(_before(), folder=tmp_path)

    assert [(a.partition, a.rows) for a in outcome.archived] == [(ranges.name, 8)]
    assert outcome.refused == []
    assert ranges.name not in _names()
    assert _rows(ranges.low, ranges.low + SIZE) == []  # out of the database
    archive = TraceArchive.objects.get()
    assert (archive.partition, archive.rows, archive.low, archive.high) == (
        ranges.name,
        8,
        ranges.low,
        ranges.low + SIZE,
    )
    assert (archive.first_id, archive.last_id) == (before[0][0], before[-1][0])
    file = tmp_path / f"{ranges.name}.jsonl.gz"
    assert archive.path == str(file.resolve()) and archive.file_name == file.name
    assert hashlib.sha256(file.read_bytes()).hexdigest() == archive.sha256
    with gzip.open(file) as read:
        lines = [json.loads(line) for line in read]
    assert [line["id"] for line in lines] == [row[0] for row in before]
    assert lines[0] == {  # every column, as JSON holds it
        column: value.isoformat() if isinstance(value, datetime) else value
        for column, value in zip(_columns(), before[0], strict=True)
    }
    manifest = json.loads((tmp_path / f"{ranges.name}.manifest.json").read_text())
    assert manifest["rows"] == 8 and manifest["sha256"] == archive.sha256
    # Each task whose trace went says where; the task of the open range does not.
    pointed = dict(Task.objects.filter(id__gte=ranges.low).values_list("id", "trace_archive"))
    assert pointed == {
        ranges.low: None,
        first.id: archive.id,
        second.id: archive.id,
        ranges.low + SIZE: None,
    }

    restored = trace_archive.restore(Path(archive.manifest_path))

    assert restored.restored_at is not None
    assert _rows(ranges.low, ranges.low + SIZE) == before  # every column, every id
    assert ranges.name in _names()
    assert not Task.objects.filter(trace_archive__isnull=False).exists()
    assert list(first.events.order_by("seq").values_list("seq", flat=True)) == [1, 2, 3]
    with pytest.raises(ArchiveRefused, match="restored already"):
        trace_archive.restore(Path(archive.manifest_path))  # once back, back once
    assert _rows(ranges.low, ranges.low + SIZE) == before


def test_the_trace_stays_append_only_after_a_restore(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    task = _task(ranges.low + 1)
    ranges.close()
    checked()
    trace_archive.archive(_before(), folder=tmp_path)
    trace_archive.restore(Path(TraceArchive.objects.get().manifest_path))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TraceEvent.objects.filter(task=task).update(detail="rewritten")
    assert set(task.events.values_list("detail", flat=True)) == {
        f"task {task.id} event {n}" for n in (1, 2, 3)
    }


@pytest.mark.parametrize(
    ("state", "uncertain", "said"),
    [
        (TaskState.RUNNING, None, "RUNNING"),
        (TaskState.QUEUED, None, "QUEUED"),
        (TaskState.NEEDS_HUMAN, None, "NEEDS_HUMAN"),
        (TaskState.COMPLETED, "UNKNOWN", "UNKNOWN write orders/7/refund"),
        (TaskState.PARTIAL, "IN_FLIGHT", "IN_FLIGHT write orders/7/refund"),
    ],
)
def test_a_range_holding_an_unfinished_task_stays_whatever_its_age(
    ranges: Ranges,
    checked: Callable[[], None],
    tmp_path: Path,
    state: str,
    uncertain: str | None,
    said: str,
) -> None:
    _task(ranges.low + 1)
    holder = _task(ranges.low + 3, state=state)
    if uncertain:
        Operation.objects.create(
            key="orders/7/refund",
            fingerprint="f" * 64,
            state=uncertain,
            tool="refund",
            task=holder,
        )
    ranges.close()
    before = _rows(ranges.low, ranges.low + SIZE)
    checked()

    outcome = trace_archive.archive(_before(), folder=tmp_path)

    assert outcome.archived == [] and outcome.planned == []
    kept = {k.partition: k for k in outcome.kept}
    assert kept[ranges.name].holding == (holder.id,)
    assert f"{holder.id} ({said})" in kept[ranges.name].why
    assert _rows(ranges.low, ranges.low + SIZE) == before
    assert ranges.name in _names() and not TraceArchive.objects.exists()
    assert list(tmp_path.iterdir()) == []  # not even a file


def test_a_range_that_can_still_receive_tasks_or_finished_lately_stays(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    now = timezone.now()
    _task(ranges.low + 1, finished=now)
    checked()
    kept = {k.partition: k.why for k in trace_archive.archive(_before(), folder=tmp_path).kept}
    assert kept[ranges.name].startswith("still open to new tasks")
    assert "never archived" in kept["console_traceevent_default"]

    ranges.close()
    month = LONG_AGO + timedelta(days=30)
    kept = {k.partition: k.why for k in trace_archive.archive(month, folder=tmp_path).kept}
    assert (
        kept[ranges.name] == f"its last task finished {now:%Y-%m-%d %H:%M}, not before 2020-02-14"
    )
    assert ranges.name in _names() and not TraceArchive.objects.exists()


def test_a_damaged_file_is_refused_on_restore_and_nothing_changes(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    task = _task(ranges.low + 1)
    ranges.close()
    checked()
    trace_archive.archive(_before(), folder=tmp_path)
    archive = TraceArchive.objects.get()
    file = Path(archive.path)
    damaged = bytearray(file.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    file.write_bytes(bytes(damaged))

    with pytest.raises(ArchiveRefused, match="damaged"):
        trace_archive.restore(Path(archive.manifest_path))

    archive.refresh_from_db()
    assert archive.restored_at is None
    assert ranges.name not in _names() and not task.events.exists()
    assert Task.objects.get(id=task.id).trace_archive_id == archive.id
    out = StringIO()
    with pytest.raises(CommandError, match=r"not restored: .*damaged"):
        call_command("restore_archive", archive.manifest_path, stdout=out)


def test_a_manifest_that_lies_about_its_rows_is_refused_and_nothing_changes(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    _task(ranges.low + 1)
    ranges.close()
    checked()
    trace_archive.archive(_before(), folder=tmp_path)
    archive = TraceArchive.objects.get()
    manifest = Path(archive.manifest_path)
    document = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**document, "rows": 2}))

    with pytest.raises(ArchiveRefused, match="does not say what archive"):
        trace_archive.restore(manifest)
    assert ranges.name not in _names()
    archive.refresh_from_db()
    assert archive.restored_at is None


def test_a_range_already_in_the_database_is_refused_on_restore(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    task = _task(ranges.low + 1)
    ranges.close()
    checked()
    trace_archive.archive(_before(), folder=tmp_path)
    archive = TraceArchive.objects.get()
    # The task was resumed after its trace left: its new events land in the default
    # partition, which may not give them up to a range made again.
    TraceEvent.objects.create(task=task, phase=2, seq=4, kind="note", detail="resumed")
    checked()

    with pytest.raises(ArchiveRefused, match=f"default partition holds trace .*{task.id}"):
        trace_archive.restore(Path(archive.manifest_path))
    assert list(task.events.values_list("detail", flat=True)) == ["resumed"]
    archive.refresh_from_db()
    assert archive.restored_at is None


def test_a_row_that_differs_from_the_file_refuses_the_drop(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    task = _task(ranges.low + 1)
    ranges.close()
    before = _rows(ranges.low, ranges.low + SIZE)
    checked()
    partition = next(p for p in history.trace_partitions() if p.name == ranges.name)
    written = trace_archive.write_partition(partition, tmp_path)
    file = Path(written.path)
    # A file whole in itself (its manifest's SHA-256 is its own) whose second row is not
    # the database's.
    lines = gzip.decompress(file.read_bytes()).splitlines(keepends=True)
    lines[1] = lines[1].replace(b"event 2", b"event X")
    file.write_bytes(gzip.compress(b"".join(lines)))
    tampered = dataclasses.replace(written, sha256=hashlib.sha256(file.read_bytes()).hexdigest())
    manifest = file.with_name(f"{ranges.name}.manifest.json")
    document = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**document, "sha256": tampered.sha256}))

    with pytest.raises(ArchiveRefused, match=f"row id {before[1][0]} differs"):
        trace_archive.check_written(tampered)

    assert ranges.name in _names() and _rows(ranges.low, ranges.low + SIZE) == before
    assert not file.exists() and not manifest.exists()  # not left looking like an archive
    assert not TraceArchive.objects.exists()
    assert Task.objects.get(id=task.id).trace_archive_id is None


def test_a_row_added_after_the_file_was_written_refuses_the_drop(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    task = _task(ranges.low + 1)
    ranges.close()
    checked()
    partition = next(p for p in history.trace_partitions() if p.name == ranges.name)
    written = trace_archive.write_partition(partition, tmp_path)
    trace_archive.check_written(written)
    TraceEvent.objects.create(task=task, phase=1, seq=9, kind="note", detail="late")
    checked()

    with pytest.raises(ArchiveRefused, match=r"holds 4 rows .* but 3 .* were written"):
        trace_archive.drop_archived(written)
    assert ranges.name in _names() and task.events.count() == 4
    assert not TraceArchive.objects.exists()

    with pytest.raises(ArchiveRefused, match="the database holds more rows than the 3"):
        trace_archive.check_written(written)


def test_the_task_page_of_an_archived_task_says_where_its_trace_went_and_keeps_its_report(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path, django_user_model: type[User]
) -> None:
    task = _task(ranges.low + 1, state=TaskState.QUEUED)
    Operation.objects.create(
        key="orders/7/notice",
        fingerprint="e" * 64,
        state="COMMITTED",
        tool="send_notice",
        task=task,
    )
    finish(task, "COMPLETED", "goal_met")
    ranges.close()
    checked()
    viewer = django_user_model.objects.create_user("vera", password="pw-vera")
    assign(viewer, (Role.VIEWER,))
    browser = Client()
    browser.force_login(viewer)
    url = f"/tasks/{task.id}/"
    with CaptureQueriesContext(connection) as kept_queries:
        page = browser.get(url).content.decode()
    assert 'id="trace-archived"' not in page

    Task.objects.filter(id=task.id).update(finished_at=LONG_AGO, updated_at=LONG_AGO)
    trace_archive.archive(_before(), folder=tmp_path)
    archive = TraceArchive.objects.get()
    with CaptureQueriesContext(connection) as archived_queries:
        response = browser.get(url)

    assert response.status_code == 200
    page = response.content.decode()
    note = re.search(r'<div id="trace-archived".*?</div>', page, re.DOTALL)
    assert note is not None
    assert archive.file_name in note.group() and archive.path in note.group()
    assert archive.manifest_path in note.group()
    assert "restore_archive" in note.group()
    assert "Nothing has happened yet" not in page
    assert "Stop report" in page and "goal_met" in page  # the report stays
    assert "orders/7/notice" in page  # and its operations
    assert len(archived_queries) <= len(kept_queries)


def _month_after_now() -> str:
    return f"{timezone.now() + timedelta(days=32):%Y-%m}"


def test_the_command_says_what_it_archived_and_what_it_kept_and_why(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    _task(ranges.low + 1)
    holder = _task(ranges.low + SIZE + 1, state=TaskState.RUNNING)  # in the next range
    _task(ranges.low + 2 * SIZE)  # which is closed by a task in the one after
    checked()

    dry = StringIO()
    call_command(
        "archive", "--before", _month_after_now(), "--dir", str(tmp_path), "--dry-run", stdout=dry
    )
    assert f"would archive {ranges.name}" in dry.getvalue()
    assert ranges.name in _names() and list(tmp_path.iterdir()) == []

    out = StringIO()
    call_command("archive", "--before", _month_after_now(), "--dir", str(tmp_path), stdout=out)
    said = out.getvalue()
    file = tmp_path / f"{ranges.name}.jsonl.gz"
    assert re.search(
        rf"^archived {ranges.name}: 3 rows to {re.escape(str(file.resolve()))} \(\d+ rows/s\)$",
        said,
        re.MULTILINE,
    ), said
    assert f"kept {ranges.next_name}: 1 unfinished task(s) hold it: {holder.id} (RUNNING)" in said
    assert f"kept console_traceevent_t{ranges.low + 2 * SIZE}: still open to new tasks" in said
    assert "kept console_traceevent_default: the default partition" in said

    back = StringIO()
    manifest = tmp_path / f"{ranges.name}.manifest.json"
    call_command("restore-archive", str(manifest), stdout=back)  # the spelling
    assert back.getvalue().startswith(f"restored {ranges.name}: 3 rows from {file.resolve()}")
    assert ranges.name in _names()


def test_the_command_refuses_a_month_it_cannot_read(tmp_path: Path) -> None:
    for bad in ("2026-13", "26-01", "January", "2026-1-01"):
        with pytest.raises(CommandError, match=r"--before: .* is not a month: write YYYY-MM"):
            call_command("archive", "--before", bad, "--dir", str(tmp_path))


def test_an_archive_file_is_never_written_over(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    _task(ranges.low + 1)
    ranges.close()
    checked()
    earlier = tmp_path / f"{ranges.name}.jsonl.gz"
    earlier.write_bytes(b"an earlier archive")
    outcome = trace_archive.archive(_before(), folder=tmp_path)
    assert [r.partition for r in outcome.refused] == [ranges.name]
    assert "exists already" in outcome.refused[0].why
    assert earlier.read_bytes() == b"an earlier archive"
    assert ranges.name in _names() and not TraceArchive.objects.exists()


def test_the_beats_archive_takes_what_the_retention_allows(
    ranges: Ranges,
    checked: Callable[[], None],
    tmp_path: Path,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The task's connection housekeeping would end this test's transaction.
    monkeypatch.setattr(beat_tasks, "close_old_connections", lambda: None)
    _task(ranges.low + 1)
    ranges.close()
    checked()
    settings.LOOPGUARD_ARCHIVE_DIR = tmp_path
    assert beat_tasks.archive() == {"archived": 0, "refused": 0, "kept": 0}  # off: nothing
    assert ranges.name in _names()

    settings.LOOPGUARD_ARCHIVE_AFTER_MONTHS = 3
    done = beat_tasks.archive()

    assert done["archived"] == 1 and done["refused"] == 0
    assert (tmp_path / f"{ranges.name}.jsonl.gz").is_file()
    assert ranges.name not in _names()


def test_months_before_counts_whole_months_back_from_the_start_of_this_one() -> None:
    at = datetime(2026, 2, 27, 23, 0, tzinfo=timezone.get_current_timezone())
    assert f"{trace_archive.months_before(at, 3):%Y-%m-%d}" == "2025-11-01"
    assert f"{trace_archive.months_before(at, 14):%Y-%m-%d}" == "2024-12-01"
    assert trace_archive.month_start("2026-01") == datetime(2026, 1, 1, tzinfo=trace_archive.UTC)


_BEAT = (
    "from django.conf import settings; "
    "print(sorted(settings.CELERY_BEAT_SCHEDULE), "
    "settings.CELERY_BEAT_SCHEDULE.get('trace-archive'), settings.LOOPGUARD_ARCHIVE_DIR)"
)


def _settings_say(**env: str) -> subprocess.CompletedProcess[str]:
    return run_python(
        f"import django; django.setup(); {_BEAT}",
        env=clean_environment(
            only_named=True, DJANGO_SETTINGS_MODULE="console.project.settings", **env
        ),
    )


def test_retention_is_off_by_default_and_the_beat_archives_daily_once_it_is_set() -> None:
    off = _settings_say()
    assert off.returncode == 0, off.stderr
    assert "trace-archive" not in off.stdout and "trace-partitions-ahead" in off.stdout
    assert off.stdout.strip().endswith(str(ROOT / ".loopguard" / "archive"))

    on = _settings_say(LOOPGUARD_ARCHIVE_AFTER_MONTHS="6", LOOPGUARD_ARCHIVE_DIR="/srv/arch")
    assert on.returncode == 0, on.stderr
    assert "'trace-archive'" in on.stdout and on.stdout.strip().endswith("/srv/arch")
    daily = "{'task': 'console.tasks.archive', 'schedule': 86400.0}"
    assert daily in on.stdout and daily not in off.stdout

    bad = _settings_say(LOOPGUARD_ARCHIVE_AFTER_MONTHS="-1")
    assert bad.returncode != 0 and "LOOPGUARD_ARCHIVE_AFTER_MONTHS must be 0" in bad.stderr


def test_one_archive_runs_at_a_time(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path, settings: Settings
) -> None:
    _task(ranges.low + 1)
    ranges.close()
    checked()
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    with psycopg.connect(url, autocommit=True) as other:  # the beat's run, say
        other.execute("SELECT pg_advisory_lock(%s)", [0x4C47415243484956])
        with pytest.raises(ArchiveRefused, match="another archive or restore is running"):
            trace_archive.archive(_before(), folder=tmp_path)
        with pytest.raises(CommandError, match="nothing archived: another archive"):
            call_command("archive", "--before", _month_after_now(), "--dir", str(tmp_path))
        assert ranges.name in _names() and list(tmp_path.iterdir()) == []
        # Let go at once (a closed connection's lock outlives it a moment on the server).
        other.execute("SELECT pg_advisory_unlock(%s)", [0x4C47415243484956])
    assert [a.partition for a in trace_archive.archive(_before(), folder=tmp_path).archived] == [
        ranges.name
    ]


def test_a_task_resumed_after_the_plan_keeps_its_range(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path
) -> None:
    task = _task(ranges.low + 1, state=TaskState.PARTIAL)
    ranges.close()
    checked()
    partition = next(p for p in history.trace_partitions() if p.name == ranges.name)
    written = trace_archive.write_partition(partition, tmp_path)
    trace_archive.check_written(written)
    # An approver resumes it before the drop: it is queued again, and its range stays.
    Task.objects.filter(id=task.id).update(state=TaskState.QUEUED, reason="", phase=2)

    with pytest.raises(ArchiveRefused, match=rf"no longer finished: {task.id} \(QUEUED\)"):
        trace_archive.drop_archived(written)
    assert ranges.name in _names() and task.events.count() == 3
    assert Task.objects.get(id=task.id).trace_archive_id is None
    assert not TraceArchive.objects.exists()


def test_a_task_whose_trace_is_archived_resumes_only_once_its_trace_is_back(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path, django_user_model: type[User]
) -> None:
    task = _task(ranges.low + 1, state=TaskState.PARTIAL)
    ranges.close()
    checked()
    trace_archive.archive(_before(), folder=tmp_path)
    archive = TraceArchive.objects.get()
    approver = django_user_model.objects.create_user("abe", password="pw-abe")
    assign(approver, (Role.APPROVER,))
    browser = Client()
    browser.force_login(approver)

    assert 'id="resume-archived"' in browser.get(f"/tasks/{task.id}/resume").content.decode()
    assert "Approve resumption…" not in browser.get(f"/tasks/{task.id}/").content.decode()
    with pytest.raises(services.Refused, match=re.escape(archive.manifest_path)):
        services.task_approve_resumption(
            task_id=task.id, actor=approver, reason="go on", enqueue=lambda _: None
        )
    assert Task.objects.get(id=task.id).state == TaskState.PARTIAL

    trace_archive.restore(Path(archive.manifest_path))
    resumed = services.task_approve_resumption(
        task_id=task.id, actor=approver, reason="go on", enqueue=lambda _: None
    )

    assert resumed.state == TaskState.QUEUED and resumed.phase == 2
    assert task.events.count() == 3  # its history is back in its own range


def test_a_completed_task_whose_trace_is_archived_is_not_offered_a_restore_to_resume(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path, django_user_model: type[User]
) -> None:
    task = _task(ranges.low + 1, state=TaskState.COMPLETED)
    ranges.close()
    checked()
    trace_archive.archive(_before(), folder=tmp_path)
    approver = django_user_model.objects.create_user("abe", password="pw-abe")
    assign(approver, (Role.APPROVER,))
    browser = Client()
    browser.force_login(approver)

    page = browser.get(f"/tasks/{task.id}/resume").content.decode()
    assert 'id="resume-archived"' not in page and "there is nothing to resume" in page
    with pytest.raises(services.StaleState, match="completed: there is nothing to resume"):
        services.task_approve_resumption(
            task_id=task.id, actor=approver, reason="go on", enqueue=lambda _: None
        )


def test_with_the_opentelemetry_export_on_a_range_leaves_only_once_its_trace_is_sent(
    ranges: Ranges, checked: Callable[[], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from console.drivers import otel

    task = _task(ranges.low + 1)
    ranges.close()
    checked()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")  # the export is on

    waiting = trace_archive.archive(_before(), folder=tmp_path)
    kept = {k.partition: k for k in waiting.kept}
    assert not waiting.archived and ranges.name in _names()
    assert "not all sent to OpenTelemetry" in kept[ranges.name].why
    assert kept[ranges.name].holding == (task.id,)

    collector = InMemorySpanExporter()  # the SDK's own exporter that keeps what it is given
    while otel.export_pass(to=collector).exported:
        pass
    assert {span.attributes["loopguard.task.id"] for span in collector.get_finished_spans()} >= {
        task.id
    }
    done = trace_archive.archive(_before(), folder=tmp_path)
    assert [a.partition for a in done.archived] == [ranges.name]
    assert ranges.name not in _names()
