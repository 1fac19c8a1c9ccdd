"""The store's exceptions."""

from __future__ import annotations

from dafka.errors import DafkaError


class StoreError(DafkaError):
    """The store cannot run (its database cannot be opened, a thread failed...)."""


class StoreLocked(StoreError):
    """Another process (or another Store in this one) has the database open.

    LevelDB allows one opener per directory; ``path`` is the directory."""

    def __init__(self, path: str, detail: str = "") -> None:
        self.path = path
        message = f"store database {path!r} is locked: another store (or another LevelDB user) has it open"
        if detail:
            message += f" ({detail})"
        super().__init__(message)
