"""Path mode: read a store's LevelDB directory directly (a stopped store, a
backup or a copy), in the store's key layout (:mod:`dafka.store.keys`).

LevelDB allows one opener per directory, enforced with a POSIX lock on the
``LOCK`` file, and Spark runs several tasks on the same directory at once, in
different Python worker processes that are reused from task to task.  So:

* nothing is ever cached: every read opens and closes what it uses;
* a task does not read the directory itself but a private *snapshot*: it holds
  the directory's lock for the few milliseconds it takes to hard-link the
  (immutable) table files and copy the small mutable ones (``CURRENT``,
  ``MANIFEST-*``, ``*.log``) into a scratch directory, then reads that copy and
  deletes it.  Tasks therefore run in parallel and never modify the source.
  Where hard links are impossible the task reads the directory itself, waiting
  for its turn (``lockTimeoutMs``);
* planning, which opens the directory itself for a moment, first lets LevelDB
  finish the compaction a store stopped mid-write leaves pending (see
  :func:`settle`), so that the tasks' snapshots do not each start it again;
* a directory locked by another process (a running store) gives a clear error
  naming that process;
* LevelDB has a trap: a *second* open of a directory in the same process fails
  and, on the way out, closes its file descriptor on ``LOCK``, which silently
  drops the lock the first opener holds (POSIX locks are per process).  Before
  touching a directory we check ``/proc/locks`` and refuse if this very
  process holds it, and a process-wide registry keeps our own readers apart.

Rows come out as Arrow record batches, built column-wise from the values
alone where the offsets are known without the keys (see :func:`read_range`),
which is several times faster than row tuples.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import plyvel
import pyarrow as pa

from dafka.store import keys, running

from . import arrow
from .options import DafkaSparkError, OptionError

log = logging.getLogger(__name__)

BATCH_ROWS = 16_384  # rows per Arrow batch (bigger ones cost more page faults than they save)
BATCH_BYTES = 32 * 1024 * 1024  # ...or fewer when the values are big
FIRST_BATCH_ROWS = 256  # the size of the values is not known before the first batch
SNAPSHOT_PREFIX = ".dafka-spark-snapshot-"

_registry_lock = threading.Lock()
_registry: set[str] = set()


class PathLocked(DafkaSparkError):
    """The directory is open in another process (a running store?)."""


@dataclass(frozen=True)
class PartitionInfo:
    """What a store holds of one partition: records ``tail .. head`` inclusive."""

    partition: str
    tail: int
    head: int


# --------------------------------------------------------------------------
# Locks
# --------------------------------------------------------------------------


def lock_holder(path: str) -> int | None:
    """The pid holding the POSIX lock on ``path/LOCK`` (Linux ``/proc/locks``), or None."""
    try:
        st = os.stat(os.path.join(path, "LOCK"))
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (blocked waiters have "->")
        if "->" in fields or len(fields) < 6 or fields[1] != "POSIX":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            if int(inode) == st.st_ino and os.makedev(int(major, 16), int(minor, 16)) == st.st_dev:
                return int(fields[4])
        except ValueError:
            continue
    return None


def running_store(path: str) -> running.RunningStore | None:
    """The store running on the directory ``path``, as it left itself there
    (store/running.py), while it holds the directory's lock; None for a
    stopped store or a copy, which are read directly."""
    found = running.read(os.path.realpath(path))
    if found is None or lock_holder(os.path.realpath(path)) != found.pid:
        return None
    return found


def _describe(pid: int | None) -> str:
    if pid is None:
        return "another process"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"process {pid}" + (f" ({cmd[:200]})" if cmd else "")


def _locked_error(path: str, pid: int | None, waited: float) -> PathLocked:
    return PathLocked(
        f"the store directory {path!r} is locked by {_describe(pid)}"
        + (f" (waited {waited:.0f} s)" if waited >= 1 else "")
        + ": LevelDB allows one opener at a time. Stop the store first, read a copy of the directory, "
          "or read the running store live with .option(\"tower\", ...) instead of \"path\"."
    )


@contextlib.contextmanager
def _claim(path: str) -> Iterator[None]:
    """Keep this process's own readers of ``path`` apart, and refuse a
    directory this process already has open (opening it again would drop the
    lock of the first opener)."""
    deadline = time.monotonic() + 60
    while True:
        with _registry_lock:
            if path not in _registry:
                _registry.add(path)
                break
        if time.monotonic() > deadline:
            raise PathLocked(f"the store directory {path!r} stays busy in this process")
        time.sleep(0.01)
    try:
        if lock_holder(path) == os.getpid():
            raise PathLocked(
                f"the store directory {path!r} is open in this very process (a dafka Store running here?); "
                "opening it a second time would silently release the running store's lock. "
                "Stop the store first, or read it live with .option(\"tower\", ...)."
            )
        yield
    finally:
        with _registry_lock:
            _registry.discard(path)


def check_directory(path: str) -> None:
    """A clear error unless ``path`` looks like a LevelDB directory."""
    if not os.path.isdir(path):
        raise OptionError(f'option "path": {path!r} is not a directory (expected a store\'s LevelDB directory, '
                          'store/db in its configuration)')
    if not os.path.exists(os.path.join(path, "CURRENT")):
        raise OptionError(f'option "path": {path!r} is not a LevelDB database (it has no CURRENT file); '
                          'give the store\'s database directory (store/db in its configuration)')


def _open(path: str, timeout: float) -> plyvel.DB:
    """Open ``path`` itself (the caller holds the registry claim), waiting up
    to ``timeout`` seconds while another process has it."""
    started = time.monotonic()
    delay = 0.01
    while True:
        try:
            return plyvel.DB(path, create_if_missing=False)
        except plyvel.IOError as exc:
            detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
            if "lock" not in detail.lower():
                raise OptionError(f'option "path": cannot open the LevelDB database {path!r}: {detail}') from None
            waited = time.monotonic() - started
            if waited >= timeout:
                raise _locked_error(path, lock_holder(path), waited) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        except plyvel.Error as exc:
            raise OptionError(f'option "path": cannot open the LevelDB database {path!r}: {exc}') from None


@contextlib.contextmanager
def open_db(path: str, timeout: float) -> Iterator[plyvel.DB]:
    """The directory itself, opened for a short look (planning); closed on exit."""
    path = os.path.realpath(path)
    check_directory(path)
    with _claim(path):
        db = _open(path, timeout)
        try:
            yield db
        finally:
            db.close()


# --------------------------------------------------------------------------
# Compaction
# --------------------------------------------------------------------------

# When LevelDB compacts (version_set.cc of the LevelDB plyvel bundles): 4 files
# in level 0, or 10 MiB in level 1 and ten times more in each level below it,
# down to level 5 (level 6 is the last).
L0_COMPACTION_TRIGGER = 4
L1_MAX_BYTES = 10 * 1048576
LAST_COMPACTED_LEVEL = 5
SETTLE_TIMEOUT = 10.0  # longest wait for LevelDB's pending compaction at planning

_LEVEL_RE = re.compile(r"^--- level (\d+) ---$")
_FILE_RE = re.compile(r"^ \d+:(\d+)\[")


def compaction_pending(db: plyvel.DB) -> bool:
    """Would LevelDB compact ``db`` now (in its background thread)?  From the
    table files per level (``leveldb.sstables``) and LevelDB's own triggers."""
    counts: dict[int, int] = {}
    sizes: dict[int, int] = {}
    level = None
    for line in (db.get_property(b"leveldb.sstables") or b"").decode("latin-1").splitlines():
        header = _LEVEL_RE.match(line)
        if header:
            level = int(header.group(1))
            continue
        table = _FILE_RE.match(line)
        if table and level is not None:
            counts[level] = counts.get(level, 0) + 1
            sizes[level] = sizes.get(level, 0) + int(table.group(1))
    if counts.get(0, 0) >= L0_COMPACTION_TRIGGER:
        return True
    return any(sizes.get(level, 0) >= L1_MAX_BYTES * 10 ** (level - 1)
               for level in range(1, LAST_COMPACTED_LEVEL + 1))


def settle(db: plyvel.DB, path: str, timeout: float = SETTLE_TIMEOUT) -> bool:
    """Let LevelDB finish compacting ``db`` (the directory itself, at
    planning), waiting up to ``timeout`` seconds; returns whether it did.

    A store stopped while it was writing leaves LevelDB work to do: a log to
    turn into tables, too many tables in level 0.  Every open starts that
    compaction in a background thread, and every close abandons it unfinished.
    Without this, each task's snapshot would start it again and burn CPU on it
    while its worker reads records (as much CPU as the reading itself, for
    nothing); finished once here, it is done for every later snapshot and
    query, as the store would have done had it kept running."""
    if not compaction_pending(db):
        return True
    log.info("dafka.spark: letting LevelDB finish compacting %s (up to %.0f s)", path, timeout)
    deadline = time.monotonic() + timeout
    while compaction_pending(db):
        if time.monotonic() >= deadline:
            log.warning("dafka.spark: LevelDB is still compacting %s after %.0f s; reading it anyway",
                        path, timeout)
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------


def _scratch_parent(path: str) -> str:
    """A directory on the same file system as ``path`` (hard links need one)."""
    tmp = tempfile.gettempdir()
    try:
        if os.stat(tmp).st_dev == os.stat(path).st_dev and os.access(tmp, os.W_OK):
            return tmp
    except OSError:
        pass
    return path


def _lock_source(path: str, timeout: float) -> int:
    """Take the directory's LevelDB lock ourselves (same POSIX lock LevelDB
    uses); returns the descriptor to close to release it."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    started = time.monotonic()
    delay = 0.005
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            waited = time.monotonic() - started
            if waited >= timeout:
                os.close(fd)
                raise _locked_error(path, lock_holder(path), waited) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _make_snapshot(path: str, timeout: float) -> str | None:
    """Hard-link/copy the database files into a scratch directory; None if
    the file system does not allow hard links there."""
    fd = _lock_source(path, timeout)
    scratch = None
    try:
        scratch = tempfile.mkdtemp(prefix=SNAPSHOT_PREFIX, dir=_scratch_parent(path))
        for name in os.listdir(path):
            src = os.path.join(path, name)
            dst = os.path.join(scratch, name)
            if name.endswith((".ldb", ".sst")):
                os.link(src, dst)  # immutable once written: sharing is safe
            elif name == "CURRENT" or name.startswith("MANIFEST-") or name.endswith(".log"):
                shutil.copyfile(src, dst)  # LevelDB appends to these: copy
        return scratch
    except OSError as exc:
        log.info("dafka.spark: cannot snapshot %s (%s); reading the directory itself", path, exc)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def snapshot_db(path: str, timeout: float) -> Iterator[plyvel.DB]:
    """A private, read-only-in-effect view of the database at ``path``."""
    path = os.path.realpath(path)
    check_directory(path)
    with _claim(path):
        scratch = _make_snapshot(path, timeout)
        if scratch is None:
            db = _open(path, timeout)
            try:
                yield db
            finally:
                db.close()
            return
    try:
        try:
            db = plyvel.DB(scratch, create_if_missing=False)
        except plyvel.Error as exc:
            raise DafkaSparkError(f"cannot open a snapshot of {path!r}: {exc}") from None
        try:
            yield db
        finally:
            db.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


def partitions(db: plyvel.DB, topic: str) -> dict[str, PartitionInfo]:
    """Every partition of ``topic`` (exact name): its oldest and newest record."""
    prefix = keys.HEAD + keys.to_bytes(topic) + b"\0"
    found = {}
    for key, value in db.iterator(prefix=prefix):
        address = key[len(prefix):-1]
        if not key.endswith(b"\0") or b"\0" in address or len(value) != keys.SEQ_BYTES:
            continue
        head = keys.seq_of(value)
        record_prefix = keys.partition_prefix(keys.RECORD, topic, address)
        first = next(db.iterator(prefix=record_prefix, include_value=False), None)
        if first is None:
            continue  # a head without records: nothing to read
        name = keys.to_str(address)
        found[name] = PartitionInfo(name, keys.seq_of(first[-keys.SEQ_BYTES:]), head)
    return found


def topics(db: plyvel.DB, limit: int = 20) -> list[str]:
    """Up to ``limit`` topic names found in the database (for error messages)."""
    names: list[str] = []
    for key in db.iterator(prefix=keys.HEAD, include_value=False):
        try:
            subject = keys.parse_key(key).subject
        except ValueError:
            continue
        if not names or names[-1] != subject:
            names.append(subject)
            if len(names) >= limit:
                break
    return names


def _stamps(db: plyvel.DB, topic: str, partition: str, start: int, end: int):
    """(firsts, lasts, unix_ms) arrays of the stamps covering ``start .. end-1``."""
    prefix = keys.partition_prefix(keys.STAMP, topic, partition)
    firsts: list[int] = []
    lasts: list[int] = []
    millis: list[int] = []
    # The newest stamp that starts at or before `start`, then every later one before `end`.
    before = next(db.iterator(start=prefix, stop=prefix + keys.seq_bytes(start + 1), reverse=True), None)
    begin = before[0] if before is not None else prefix
    for key, value in db.iterator(start=begin, stop=prefix + keys.seq_bytes(end) if end < 2**64 else keys.prefix_end(prefix)):
        try:
            stamp = keys.decode_stamp(key, value)
        except ValueError:
            continue
        firsts.append(stamp.first)
        lasts.append(stamp.last)
        millis.append(stamp.unix_ms)
    return (np.array(firsts, dtype=np.uint64), np.array(lasts, dtype=np.uint64), np.array(millis, dtype=np.int64))


def timestamps(offsets: np.ndarray, stamps) -> pa.Array:
    """The receive time of each record, from the store's stamps (null where unknown)."""
    firsts, lasts, millis = stamps
    if len(firsts) == 0:
        return arrow.null_timestamps(len(offsets))
    idx = np.searchsorted(firsts, offsets, side="right").astype(np.int64) - 1
    clipped = np.clip(idx, 0, None)
    known = (idx >= 0) & (offsets <= lasts[clipped])
    return arrow.timestamps(millis[clipped] * 1000, known)


def _key(prefix: bytes, seq: int) -> bytes:
    """The key of record ``seq`` under ``prefix``; past the last possible one,
    the end of the partition (an exclusive ``stop``)."""
    return prefix + keys.seq_bytes(seq) if seq < 2**64 else keys.prefix_end(prefix)


def _first_at_or_after(db: plyvel.DB, prefix: bytes, start: int, end: int) -> int | None:
    """The offset of the first record in ``start .. end-1``, if any."""
    key = next(db.iterator(start=_key(prefix, start), stop=_key(prefix, end), include_value=False), None)
    return None if key is None else keys.seq_of(key[-keys.SEQ_BYTES:])


def _offsets_of(db: plyvel.DB, prefix: bytes, start: int, end: int, count: int) -> np.ndarray:
    """The offsets of the ``count`` records in ``start .. end-1`` (a range with gaps)."""
    found = list(db.iterator(start=_key(prefix, start), stop=_key(prefix, end), include_value=False))
    key_len = len(prefix) + keys.SEQ_BYTES
    if len(found) != count or any(len(k) != key_len for k in found):
        raise DafkaSparkError(f"unexpected record keys under {prefix!r} in offsets {start}..{end - 1}: "
                              "the database does not have the store's key layout")
    raw = np.frombuffer(b"".join(found), dtype=np.uint8).reshape(count, key_len)
    return raw[:, -keys.SEQ_BYTES:].copy().view(">u8").ravel().astype(np.uint64)


def read_range(db: plyvel.DB, topic: str, partition: str, start: int, end: int,
               schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Records ``start .. end-1`` of one partition as Arrow batches of ``schema``
    (topic, partition, offset, value, timestamp, key).

    Python's cost per record is what limits a path read, so records are read
    without their keys, one chunk of offsets ``first .. first+n-1`` at a time:
    each key in that key range is the partition's prefix and one distinct
    offset (the store's layout), so a chunk that yields ``n`` values holds
    exactly those offsets.  Only a chunk with a gap in it (records deleted by
    retention, a store that never got some) has its keys read as well, to know
    which offsets it holds.  Records' keys (rfc section 18) are read apart, one
    seek a chunk, which finds none in an unkeyed partition.  Nothing writes to
    the database meanwhile (a private snapshot, or the directory under its
    lock), so the reads agree."""
    if end <= start:
        return
    prefix = keys.partition_prefix(keys.RECORD, topic, partition)
    keys_prefix = keys.partition_prefix(keys.RECORD_KEY, topic, partition)
    stamps = _stamps(db, topic, partition, start, end)
    batches = arrow.Batches(schema, topic, partition)
    rows = FIRST_BATCH_ROWS
    position = start
    while position < end:
        first = _first_at_or_after(db, prefix, position, end)
        if first is None:
            return
        stop = min(end, first + rows)
        values = list(db.iterator(start=_key(prefix, first), stop=_key(prefix, stop), include_key=False))
        if len(values) == stop - first:
            offsets = np.arange(first, stop, dtype=np.uint64)
        else:
            offsets = _offsets_of(db, prefix, first, stop, len(values))
        found = {keys.seq_of(k[-keys.SEQ_BYTES:]): v[1:]  # (after the entry's flag byte)
                 for k, v in db.iterator(start=_key(keys_prefix, first), stop=_key(keys_prefix, stop))}
        record_keys = arrow.keys_of([found.get(int(o)) for o in offsets]) if found else None
        batch = batches.batch(offsets, values, timestamps(offsets, stamps), record_keys)
        del values
        yield batch
        position = stop
        # Keep batches near BATCH_BYTES whatever the record size.
        size = batch.column(3).nbytes
        rows = BATCH_ROWS if size == 0 else int(min(BATCH_ROWS, max(1, batch.num_rows * BATCH_BYTES // size)))
