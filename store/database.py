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

import logging
import os
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import msgpack
import plyvel

from . import keys
from .errors import StoreError, StoreLocked

log = logging.getLogger(__name__)


def leveldb_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """plyvel's options from the store's keys.  Each open table keeps its index
    block in memory (one entry per block: about 300 KiB for a 2 MiB table of
    small, compressible records with 4 KiB blocks), so ``store/block_bytes`` and
    ``store/max_open_files`` bound that; ``store/write_buffer_bytes`` is the
    memtable (LevelDB holds two while one is written to disk) and
    ``store/cache_bytes`` the block cache.  Block size is a writer's choice
    recorded in each table: any LevelDB reads tables of any block size, and of
    either compression (``store/compression``: a flag in each block)."""
    return {
        "compression": None if config["store/compression"] == "none" else "snappy",
        "write_buffer_size": config["store/write_buffer_bytes"],
        "lru_cache_size": config["store/cache_bytes"],
        "block_size": config["store/block_bytes"],
        "max_open_files": config["store/max_open_files"],
    }


def open_db(path: str, options: Mapping[str, Any] | None = None) -> plyvel.DB:
    """Open (creating if needed) the LevelDB directory ``path`` with plyvel
    ``options`` (:func:`leveldb_options`; LevelDB's defaults if None).

    Raises :class:`StoreLocked` if another opener holds it, :class:`StoreError`
    for anything else that keeps it from opening."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the store database directory {path!r}: {exc}") from exc
    try:
        db = plyvel.DB(path, create_if_missing=True, **(options or {}))
    except plyvel.IOError as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if "lock" in detail.lower():
            raise StoreLocked(path, detail) from None
        raise StoreError(f"cannot open the store database {path!r}: {detail}") from exc
    except plyvel.Error as exc:
        raise StoreError(f"cannot open the store database {path!r}: {exc}") from exc
    try:
        check_format(db, path)
        if db.get(keys.HEADS_END) is None:
            db.put(keys.HEADS_END, b"")
    except BaseException:
        db.close()
        raise
    return db


def check_format(db: plyvel.DB, path: str) -> int:
    """The database's layout version (:data:`keys.FORMAT_VERSION`), written
    if it has none (a reference or dafka-py 0.1.0 database: the same layout).

    Raises :class:`StoreError` for a version this code does not know."""
    raw = db.get(keys.FORMAT)
    if raw is None:
        db.put(keys.FORMAT, msgpack.packb(keys.FORMAT_VERSION))
        return keys.FORMAT_VERSION
    try:
        version = msgpack.unpackb(raw)
    except (ValueError, msgpack.UnpackException) as exc:
        raise StoreError(f"store database {path!r} has an unreadable format version {raw!r}: {exc}") from None
    if not isinstance(version, int) or not 1 <= version <= keys.FORMAT_VERSION:
        raise StoreError(f"store database {path!r} has format version {version!r}; this dafka "
                         f"reads format 1 to {keys.FORMAT_VERSION}: upgrade dafka to open it")
    return version


def store_identity(db: plyvel.DB) -> str:
    """The store's identity (:data:`keys.STORE_ID`), drawn and kept the first time a store opens the
    database (a reference store's database too: the reference reads only 'M' and 'H' keys)."""
    raw = db.get(keys.STORE_ID)
    if raw is None or len(raw) != 32:
        if raw is not None:
            log.warning("store: an unreadable identity %r in the database; drawing a new one", raw)
        raw = uuid.uuid4().hex.upper().encode()
        db.put(keys.STORE_ID, raw, sync=True)
    return raw.decode()


class SharedDB:
    def __init__(self, path: str, options: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self._options = options
        self.lock = threading.Lock()
        self.db: plyvel.DB | None = open_db(path, self._options)
        self.generation = 0
        # record key prefix -> the partition's floor (store/retention.py): the writer sets it after each
        # deletion, the reader starts its seeks there instead of over the deleted records' tombstones.
        self.floors: dict[bytes, int] = {}
        # record key prefix -> where the partition's newest stamp starts: the writer sets it after each batch,
        # the reader's stamp lookups never look past it (store/reader.py: Reader._stamps).
        self.newest_stamps: dict[bytes, int] = {}

    def forget(self, prefix: bytes) -> None:
        """The partition under (record key) ``prefix`` was deleted whole."""
        self.floors.pop(prefix, None)
        self.newest_stamps.pop(prefix, None)

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
            self.db = open_db(self.path, self._options)

    def close(self) -> None:
        with self.lock:
            if self.db is not None:
                self.db.close()
                self.db = None
