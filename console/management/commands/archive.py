"""Take the trace's old partitions out of the database, to checked files:
``manage.py archive --before 2026-01 [--dir DIR] [--dry-run]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.drivers import archive as trace_archive


class Command(BaseCommand):
    help = (
        "Write each closed partition of the trace whose tasks all finished before the month "
        "YYYY-MM to DIR (a .jsonl.gz file and its manifest), read it back and compare it "
        "with the database row by row, and only then drop the partition. A range holding a "
        "task not finished (queued, running, waiting for a person, or with a write IN_FLIGHT "
        "or UNKNOWN) stays, whatever its age. Bring one back with restore_archive MANIFEST."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--before", required=True, metavar="YYYY-MM", help="tasks finished before this month"
        )
        parser.add_argument(
            "--dir",
            type=Path,
            default=None,
            help=f"where the files go (LOOPGUARD_ARCHIVE_DIR: {settings.LOOPGUARD_ARCHIVE_DIR})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="say what would be archived; change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            before = trace_archive.month_start(options["before"])
        except ValueError as error:
            raise CommandError(f"--before: {error}") from None
        dry_run = bool(options["dry_run"])
        try:
            outcome = trace_archive.archive(before, folder=options["dir"], dry_run=dry_run)
        except trace_archive.ArchiveRefused as error:
            raise CommandError(f"nothing archived: {error}") from None
        said = f"tasks finished before {before:%Y-%m-%d}"
        if dry_run:
            for partition in outcome.planned:
                self.stdout.write(f"would archive {partition.name} ({said})")
        for done in outcome.archived:
            self.stdout.write(
                f"archived {done.partition}: {done.rows} rows to {done.path} "
                f"({done.rows_per_second:.0f} rows/s)"
            )
        for refused in outcome.refused:
            self.stdout.write(f"refused {refused.partition}: {refused.why}")
        for kept in outcome.kept:
            self.stdout.write(f"kept {kept.partition}: {kept.why}")
        if not outcome.archived and not outcome.planned:
            self.stdout.write(f"nothing to archive ({said})")
        if outcome.refused:
            raise CommandError(
                f"{len(outcome.refused)} partition(s) refused and left in the database (above)"
            )
