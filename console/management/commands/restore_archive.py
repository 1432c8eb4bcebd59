"""Bring an archived partition of the trace back: ``manage.py restore_archive MANIFEST``
(``manage.py restore-archive MANIFEST`` is the same command)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.drivers import archive as trace_archive


class Command(BaseCommand):
    help = (
        "Put the rows of an archived partition of the trace back into the database, with "
        "their ids, from MANIFEST (<partition>.manifest.json, beside its .jsonl.gz file). "
        "Refused, with nothing changed, when the file's SHA-256 is not the manifest's, a row "
        "is not what it says, or the range is in the database already."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("manifest", type=Path, help="the archive's .manifest.json")

    def handle(self, *args: Any, **options: Any) -> None:
        manifest: Path = options["manifest"]
        try:
            archive = trace_archive.restore(manifest)
        except trace_archive.ArchiveRefused as refused:
            raise CommandError(f"not restored: {refused}") from None
        self.stdout.write(
            f"restored {archive.partition}: {archive.rows} rows from {archive.path}; its "
            "tasks' pages show their trace again"
        )
