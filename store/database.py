"""The store's one LevelDB handle, shared by the writer and reader threads.

LevelDB 1.22 (the one bundled with plyvel) keeps appending to a log file that
a failed write (for example ENOSPC) left misaligned: later writes on the same
handle report success, but the next open drops them as corrupt.  A store that
acked those writes would lose acked records.  So after any failed write the
writer calls :meth:`SharedDB.reopen` before it writes anything again; the
reader does its database work under :attr:`SharedDB.lock` and notices the new
:attr:`SharedDB.generation` (its iterators died with the old handle).
"""

from __future__ import annotations

import os
import threading

import plyvel

from .errors import StoreError, StoreLocked

WRITE_BUFFER_BYTES = 32 * 1024 * 1024  # LevelDB memtable size: fewer, larger level-0 files under load


def open_db(path: str) -> plyvel.DB:
    """Open (creating if needed) the LevelDB directory ``path``.

    Raises :class:`StoreLocked` if another opener holds it, :class:`StoreError`
    for anything else that keeps it from opening."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the store database directory {path!r}: {exc}") from exc
    try:
        return plyvel.DB(path, create_if_missing=True, write_buffer_size=WRITE_BUFFER_BYTES)
    except plyvel.IOError as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if "lock" in detail.lower():
            raise StoreLocked(path, detail) from None
        raise StoreError(f"cannot open the store database {path!r}: {detail}") from exc
    except plyvel.Error as exc:
        raise StoreError(f"cannot open the store database {path!r}: {exc}") from exc


class SharedDB:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.db: plyvel.DB | None = open_db(path)
        self.generation = 0

    def reopen(self) -> None:
        """Close and open the database again; raises :class:`StoreError` if it
        cannot be opened yet (``db`` is then None until a later call succeeds)."""
        with self.lock:
            if self.db is not None:
                try:
                    self.db.close()
                except plyvel.Error:
                    pass
                self.db = None
                self.generation += 1
            self.db = open_db(self.path)

    def close(self) -> None:
        with self.lock:
            if self.db is not None:
                self.db.close()
                self.db = None
