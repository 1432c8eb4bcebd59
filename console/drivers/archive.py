"""Archives of the trace: a closed partition of finished tasks written to a file, checked
against the database, and only then dropped from it; and brought back.

:func:`archive` takes each partition :func:`console.store.archive.plan_archive` allows:

1. :func:`write_partition` writes its rows, in id order, to ``<dir>/<partition>.jsonl.gz``
   (one JSON object per row, every column) and ``<partition>.manifest.json`` beside it (the
   rows, first and last ids, the range, the file's SHA-256, when), each to a temporary name
   first, fsynced, then renamed, and the folder fsynced: a crash leaves no file that looks
   whole and is not.
2. :func:`check_written` reads the file back from the disk: its SHA-256 must be the
   manifest's, and each of its lines must be, byte for byte, the database's row as
   PostgreSQL writes it in JSON (read again), row by row, with none more on either side.
3. Only then :func:`console.store.archive.drop_archived` drops the partition, in one
   transaction that checks it still holds exactly those rows.

Anything wrong at any step refuses that partition (:class:`ArchiveRefused`): its files are
removed, and the partition stays in the database as it was. :func:`restore` checks a
manifest and its file (the SHA-256, then every line as it goes back) and puts the rows back
with their ids.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import re
import time
import zlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.utils import timezone

from console.drivers import otel
from console.models import TraceArchive
from console.store.archive import (
    HOLDERS_NAMED,
    ArchiveRefused,
    Kept,
    Partition,
    Plan,
    Written,
    drop_archived,
    one_at_a_time,
    partition_columns,
    partition_lines,
    partition_name,
    partition_present,
    plan_archive,
    restore_rows,
)

__all__ = [
    "ArchiveRefused",
    "Archived",
    "Outcome",
    "archive",
    "check_written",
    "manifest_of",
    "month_start",
    "months_before",
    "restore",
    "write_partition",
]

logger = logging.getLogger(__name__)

FORMAT = 1
"""The manifest's format: what :func:`restore` knows how to read."""
_MONTH = re.compile(r"^(\d{4})-(\d{2})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BLOCK = 1 << 20


@dataclass(frozen=True, slots=True)
class Archived:
    """One partition out of the database: its file and how long it took."""

    partition: str
    rows: int
    path: Path
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float(self.rows)


@dataclass(slots=True)
class Outcome:
    """What one ``archive --before`` did: the partitions archived, those refused on the way
    (still in the database) and those kept, each with why."""

    before: datetime
    archived: list[Archived] = field(default_factory=list)
    refused: list[Kept] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    planned: list[Partition] = field(default_factory=list)
    """The partitions that may leave: with ``dry_run``, what would be archived."""


def month_start(text: str) -> datetime:
    """The start (UTC) of the month ``YYYY-MM``, the ``--before`` of ``manage.py archive``."""
    found = _MONTH.match(text.strip())
    if found is None or not 1 <= int(found[2]) <= 12 or int(found[1]) < 1:
        raise ValueError(f"{text!r} is not a month: write YYYY-MM, e.g. 2026-01")
    return datetime(int(found[1]), int(found[2]), 1, tzinfo=UTC)


def months_before(now: datetime, months: int) -> datetime:
    """The start of the month ``months`` whole months before ``now``'s (UTC): what the
    retention setting gives the beat's ``archive`` as ``--before``."""
    at = now.astimezone(UTC)
    index = at.year * 12 + (at.month - 1) - months
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def archive(before: datetime, *, folder: Path | None = None, dry_run: bool = False) -> Outcome:
    """Archive every closed partition whose tasks all finished before ``before`` into
    ``folder`` (``LOOPGUARD_ARCHIVE_DIR``); with ``dry_run``, only say what would be."""
    if dry_run:
        plan: Plan = _sent_first(plan_archive(before))
        return Outcome(before, kept=list(plan.kept), planned=list(plan.archivable))
    with one_at_a_time():
        return _archive(before, Path(folder or settings.LOOPGUARD_ARCHIVE_DIR))


def _archive(before: datetime, where: Path) -> Outcome:
    plan = _sent_first(plan_archive(before))  # under the lock: no other run takes any of it
    outcome = Outcome(before, kept=list(plan.kept), planned=list(plan.archivable))
    for partition in plan.archivable:
        started = time.perf_counter()
        try:
            written = write_partition(partition, where)
            check_written(written)
            try:
                drop_archived(written)
            except ArchiveRefused:
                # Still in the database: the files this run wrote are no archive. If that
                # cannot be told (the connection lost as the drop committed, say), they
                # may be the only copy: kept.
                if _still_there(partition.name):
                    for path in _files(where, partition.name):
                        path.unlink(missing_ok=True)
                raise
        except ArchiveRefused as refused:
            logger.warning("trace partition %s kept: %s", partition.name, refused)
            outcome.refused.append(Kept(partition.name, str(refused)))
            continue
        done = Archived(
            written.partition, written.rows, Path(written.path), time.perf_counter() - started
        )
        logger.info(
            "trace partition %s archived: %d rows to %s (%.0f rows/s)",
            done.partition,
            done.rows,
            done.path,
            done.rows_per_second,
        )
        outcome.archived.append(done)
    return outcome


def _sent_first(plan: Plan) -> Plan:
    """``plan`` without the partitions whose trace the OpenTelemetry export, when it is on,
    has not all sent yet: the export reads the trace in the database, so a range dropped
    first would never reach the collector. Kept, saying so; a later run takes them."""
    if otel.endpoint() is None:
        return plan
    archivable, kept = [], list(plan.kept)
    for partition in plan.archivable:
        behind = otel.unsent_tasks(partition.low, partition.high, most=HOLDERS_NAMED)
        if not behind:
            archivable.append(partition)
            continue
        named = ", ".join(str(task_id) for task_id in behind)
        why = f"its trace is not all sent to OpenTelemetry yet (tasks {named})"
        kept.append(Kept(partition.name, why, tuple(behind)))
    return Plan(plan.before, archivable, kept)


def _still_there(name: str) -> bool:
    try:
        return partition_present(name)
    except Exception:  # the database not answering: nothing is known
        logger.warning("whether %s is still in the database is not known", name)
        return False


# -- writing ---------------------------------------------------------------------------------


class _Hashed:
    """A file being written, with the SHA-256 of every byte that went into it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _files(folder: Path, name: str) -> tuple[Path, Path]:
    return folder / f"{name}.jsonl.gz", folder / f"{name}.manifest.json"


def write_partition(partition: Partition, folder: Path) -> Written:
    """Write ``partition``'s rows and its manifest into ``folder``, both fsynced; what was
    written. Refused if either file exists already (an earlier archive's: never replaced)."""
    if partition.high is None:
        raise ArchiveRefused(f"{partition.name} has no upper bound: not a closed range")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ArchiveRefused(f"cannot write into {folder}: {error}") from None
    target, manifest = _files(folder, partition.name)
    for path in (target, manifest):
        if path.exists():
            raise ArchiveRefused(
                f"{path} exists already (an earlier archive of {partition.name}?): move it "
                "away, or archive into another --dir"
            )
    columns = partition_columns(partition.name)
    partial = target.with_name(target.name + ".partial")
    # Left by a run that died while writing (one run at a time holds the archives' lock):
    # never an archive, since a file is renamed to its name only once whole.
    partial.unlink(missing_ok=True)
    count, first, last = 0, None, None
    try:
        with partial.open("xb") as raw:
            hashed = _Hashed(raw)
            # mtime=0: the same rows give the same file, whenever they are written.
            with (
                gzip.GzipFile(
                    filename="", mode="wb", fileobj=hashed, compresslevel=6, mtime=0
                ) as out,
                contextlib.closing(partition_lines(partition.name)) as rows,
            ):
                for row_id, text in rows:
                    out.write(text.encode() + b"\n")
                    first = row_id if first is None else first
                    last, count = row_id, count + 1
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, target)
        written = Written(
            partition=partition.name,
            low=partition.low,
            high=partition.high,
            path=str(target.resolve()),
            sha256=hashed.digest.hexdigest(),
            rows=count,
            first_id=first,
            last_id=last,
        )
        _write_fsynced(manifest, _manifest_bytes(written, columns))
        _fsync_folder(folder)
    except BaseException as error:
        for path in (partial, target, manifest):
            path.unlink(missing_ok=True)
        if isinstance(error, OSError):  # a full disk, a folder not ours
            raise ArchiveRefused(f"{target} not written: {error}") from None
        raise
    return written


def _manifest_bytes(written: Written, columns: Sequence[str]) -> bytes:
    document = {
        "format": FORMAT,
        "table": "console_traceevent",
        "partition": written.partition,
        "low": written.low,
        "high": written.high,
        "file": Path(written.path).name,
        "sha256": written.sha256,
        "rows": written.rows,
        "first_id": written.first_id,
        "last_id": written.last_id,
        "columns": list(columns),
        "written_at": timezone.now().astimezone(UTC).isoformat(),
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def _write_fsynced(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def _fsync_folder(folder: Path) -> None:
    # The renames above are in the folder's entries: fsynced too, or a crash may lose them.
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


# -- checking ----------------------------------------------------------------------------------


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as read:
        while block := read.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def check_written(written: Written) -> None:
    """Read ``written``'s file and manifest back from the disk and compare them with what
    was written and with the database, row by row; refused (the files removed, the
    partition untouched) at the first difference."""
    target, manifest = (
        Path(written.path),
        Path(written.path).with_name(f"{written.partition}.manifest.json"),
    )
    try:
        try:
            _check(written, target, manifest)
        except (OSError, EOFError, zlib.error) as error:  # not readable as it was written
            raise ArchiveRefused(f"{target} does not read back: {error}") from None
    except ArchiveRefused:
        for path in (target, manifest):
            path.unlink(missing_ok=True)
        raise


def _check(written: Written, target: Path, manifest: Path) -> None:
    found = manifest_of(manifest)
    said = (found["partition"], found["rows"], found["first_id"], found["last_id"])
    if said != (written.partition, written.rows, written.first_id, written.last_id):
        raise ArchiveRefused(f"{manifest} does not say what was written")
    if _sha256_of(target) != written.sha256 or found["sha256"] != written.sha256:
        raise ArchiveRefused(f"{target} read back is not what was written (SHA-256 differs)")
    count = 0
    with (
        gzip.open(target, "rb") as lines,
        contextlib.closing(partition_lines(written.partition)) as rows,
    ):
        for row_id, text in rows:
            line = lines.readline().rstrip(b"\n")
            if not line:
                raise ArchiveRefused(
                    f"{written.partition}: the database holds more rows than the "
                    f"{written.rows} of {target.name}: not dropped"
                )
            if line != text.encode():
                raise ArchiveRefused(
                    f"{written.partition}: row id {row_id} differs from line {count + 1} of "
                    f"{target.name}: not dropped"
                )
            count += 1
        extra = lines.readline()
    if extra or count != written.rows:
        raise ArchiveRefused(
            f"{written.partition}: the database holds {count} rows, fewer than "
            f"{target.name}: not dropped"
        )


def manifest_of(path: Path) -> dict[str, Any]:
    """A manifest read and checked: its fields present and of their kinds."""
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise ArchiveRefused(f"{path} is not a readable manifest: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ArchiveRefused(f"{path} is not a manifest of format {FORMAT}")
    problems = []
    for name, kinds in (
        ("partition", str),
        ("high", int),
        ("file", str),
        ("sha256", str),
        ("rows", int),
        ("columns", list),
    ):
        if not isinstance(document.get(name), kinds) or isinstance(document.get(name), bool):
            problems.append(name)
    for name in ("low", "first_id", "last_id"):
        if document.get(name) is not None and not isinstance(document.get(name), int):
            problems.append(name)
    if problems:
        raise ArchiveRefused(f"{path}: missing or wrong {', '.join(problems)}")
    if document["partition"] != partition_name(document["low"]):
        raise ArchiveRefused(f"{path}: partition {document['partition']!r} is not its range's")
    file = document["file"]
    if file != f"{document['partition']}.jsonl.gz" or _SHA256.match(document["sha256"]) is None:
        raise ArchiveRefused(f"{path}: the file's name or SHA-256 is not an archive's")
    if not all(isinstance(c, str) for c in document["columns"]) or "id" not in document["columns"]:
        raise ArchiveRefused(f"{path}: its columns are not a trace's")
    return document


# -- restoring ---------------------------------------------------------------------------------


def restore(manifest: Path) -> TraceArchive:
    """Bring back the partition ``manifest`` describes: its file's SHA-256 checked, each line
    checked as it goes back, the rows put back with their ids, the archive marked restored
    and its tasks pointed back at the database. Refused (:class:`ArchiveRefused`) with
    nothing changed when the file is damaged, a row is not what the manifest says, or the
    range is in the database already."""
    found = manifest_of(manifest)
    target = manifest.parent / found["file"]
    if not target.is_file():
        raise ArchiveRefused(f"{target} (named by {manifest.name}) is not there")
    try:
        digest = _sha256_of(target)
    except OSError as error:
        raise ArchiveRefused(f"{target} cannot be read: {error}") from None
    if digest != found["sha256"]:
        raise ArchiveRefused(
            f"{target} is damaged: its SHA-256 is not the manifest's. Nothing was restored"
        )
    archive = TraceArchive.objects.filter(
        partition=found["partition"], sha256=found["sha256"], restored_at__isnull=True
    ).first()
    if archive is None:
        raise ArchiveRefused(
            f"no archive of {found['partition']} with this file's SHA-256 is out of the "
            "database (restored already, or archived from another database)"
        )
    said = (found["low"], found["high"], found["rows"], found["first_id"], found["last_id"])
    if said != (archive.low, archive.high, archive.rows, archive.first_id, archive.last_id):
        raise ArchiveRefused(f"{manifest} does not say what archive {archive.id} recorded")
    columns: list[str] = found["columns"]
    rows = _rows_of(target, columns, archive)
    try:
        with one_at_a_time():
            restore_rows(archive, columns, rows)
    finally:
        rows.close()
    return archive


def _rows_of(target: Path, columns: list[str], archive: TraceArchive) -> Generator[list[Any]]:
    """The file's rows, each checked: its columns the manifest's, its id above the one
    before, its task in the archive's range."""
    wanted = set(columns)
    at_id, at_task = columns.index("id"), columns.index("task_id") if "task_id" in wanted else -1
    previous: int | None = None
    with gzip.open(target, "rb") as lines:
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError:
                raise ArchiveRefused(f"{target.name} line {number} is not JSON") from None
            if not isinstance(row, dict) or set(row) != wanted:
                raise ArchiveRefused(f"{target.name} line {number}: not the manifest's columns")
            values = [_stored(row[column]) for column in columns]
            row_id, task_id = values[at_id], values[at_task] if at_task >= 0 else None
            if not isinstance(row_id, int) or (previous is not None and row_id <= previous):
                raise ArchiveRefused(f"{target.name} line {number}: ids out of order")
            if not isinstance(task_id, int) or not (
                (archive.low is None or task_id >= archive.low) and task_id < archive.high
            ):
                raise ArchiveRefused(f"{target.name} line {number}: a task outside the range")
            previous = row_id
            yield values


def _stored(value: Any) -> Any:
    # A value JSON nests (no column of the trace holds one today) goes back as JSON text.
    return json.dumps(value) if isinstance(value, dict | list) else value
