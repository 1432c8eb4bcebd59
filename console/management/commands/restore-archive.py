"""``manage.py restore-archive MANIFEST``, the spelling of issue 23: ``restore_archive``."""

from console.management.commands.restore_archive import Command

__all__ = ["Command"]
