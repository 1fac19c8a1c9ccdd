"""Configuration: the reference's keys and defaults, read from its ZPL files.

The reference (zeromq/dafka) reads its settings with CZMQ's ``zconfig`` from a
ZPL file (ZeroMQ RFC 4), and this module reads the same files, so an existing
dafka config works unchanged.  ZPL in short::

    #   A comment
    producer                      # a name alone opens a section
        head_interval = 1000      # children are indented 4 spaces per level
    consumer
        offset
            reset = earliest
    beacon
        sub_address = "tcp://127.0.0.1:5556"   # values may be quoted "" or ''

* Indentation is exactly 4 spaces per level, never tabs, and a child sits one
  level below its parent.
* A name is made of letters, digits and ``$-_@.&+/``.  A node may have both a
  value and children.  ``a/b = 1`` at the top level is the same key as ``b = 1``
  inside section ``a``.
* A ``#`` at the start of a value or after whitespace, outside quotes, starts a
  comment, so ``tcp://*:5556`` and ``"x # y = z"`` are plain values.
* Blank lines and comment lines are ignored whatever their indentation.

Keys are addressed by their path (``"producer/head_interval"``).  The schema
is :data:`KEYS`; :class:`Config` is an immutable mapping of typed values built
from the defaults, then a file, then overrides from code or the command line.
Anything wrong raises :class:`ConfigError` naming the file, line and key.
Unknown keys in a file are logged and ignored (the reference ignores them, and
a config may be shared with other tools); unknown keys in overrides are errors.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Union

log = logging.getLogger("dafka.config")

__all__ = [
    "ConfigError",
    "Key",
    "KEYS",
    "define",
    "parse_zpl",
    "parse_override",
    "Config",
]

KINDS = ("int", "bool", "str", "choice")

# Integers end up in socket options and 64-bit counters; refuse anything that
# cannot fit rather than failing later deep inside the transport.
_INT_MAX = 2**63 - 1
_INT_MIN = -(2**63)

_NAME = re.compile(r"[A-Za-z0-9$\-_@.&+/]+")
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_COMMENT = re.compile(r"(?:^|\s)#")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """A bad config file, value or key.

    ``file`` is the file (or other source, e.g. ``"command line"``) the bad
    setting came from, ``line`` its 1-based line number, ``key`` the key path
    and ``reason`` what is wrong.  Each may be None except ``reason``.
    ``str(err)`` reads ``file:line: key: reason``; an error about a whole file
    (no line, no key) reads ``reason: file``.
    """

    def __init__(
        self,
        reason: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.key = key
        self.reason = reason
        super().__init__(self._format())

    def _format(self) -> str:
        if self.file is not None and self.line is None and self.key is None:
            return f"{self.reason}: {self.file}"
        where = self.file if self.file is not None else ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        parts = [p for p in (where, self.key) if p]
        return ": ".join([*parts, self.reason])


@dataclass(frozen=True)
class Key:
    """One config key: its path, type, default and a one-line description.

    ``unit`` (plural, e.g. ``"milliseconds"``) only improves error messages.
    """

    path: str
    kind: str
    default: object
    doc: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    unit: str = ""

    def parse(self, value: object) -> object:
        """Return ``value`` as this key's type: strings are parsed, typed
        values are checked.  Raises ``ValueError`` with the reason."""
        return _PARSERS[self.kind](self, value)


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------


def _parse_int(key: Key, value: object) -> int:
    expected = f"an integer number of {key.unit}" if key.unit else "an integer"
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise ValueError(f"expected {expected}, got {value!r}")
        number = int(value)
        if value[0] in "+-" and key.minimum is not None and key.minimum >= 0:
            if number >= key.minimum:
                raise ValueError(f"expected {expected} without a sign, got {value!r}")
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise ValueError(f"expected {expected}, got {value!r}")
    if key.minimum is not None and number < key.minimum:
        raise ValueError(f"must be at least {key.minimum}, got {number}")
    if not _INT_MIN <= number <= _INT_MAX:
        raise ValueError(f"out of range (a 64-bit integer), got {number}")
    return number


def _parse_bool(key: Key, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ValueError(
        f"expected a boolean (0/1, true/false, yes/no, on/off), got {value!r}"
    )


def _parse_str(key: Key, value: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    if _zpl_value(value) is None:
        raise ValueError(
            f"cannot be written in a ZPL file (a line break, or both kinds of "
            f"quote with leading/trailing spaces or ' #'), got {value!r}"
        )
    return value


def _parse_choice(key: Key, value: object) -> str:
    if isinstance(value, str) and value.lower() in key.choices:
        return value.lower()
    listed = ", ".join(repr(c) for c in key.choices)
    raise ValueError(f"expected one of {listed}, got {value!r}")


_PARSERS = {
    "int": _parse_int,
    "bool": _parse_bool,
    "str": _parse_str,
    "choice": _parse_choice,
}


def _zpl_value(text: str) -> str | None:
    """``text`` as it can be written after ``=`` in ZPL, or None if it cannot.

    ZPL has no escapes: a quoted value cannot hold its own quote character
    and an unquoted one cannot hold a comment or surrounding spaces.
    """
    if "\n" in text or "\r" in text:
        return None
    if '"' not in text:
        return f'"{text}"'
    if "'" not in text:
        return f"'{text}'"
    if text == text.strip() and text[0] not in "\"'" and not _COMMENT.search(text):
        return text
    return None


def _format_value(key: Key, value: object) -> str:
    if key.kind == "bool":
        return "1" if value else "0"
    if key.kind == "int":
        return str(value)
    quoted = _zpl_value(str(value))
    assert quoted is not None, "str values are checked on the way in"
    return quoted


# --------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------

KEYS: dict[str, Key] = {}


def define(
    path: str,
    kind: str,
    default: object,
    doc: str,
    *,
    choices: tuple[str, ...] = (),
    minimum: int | None = None,
    unit: str = "",
) -> Key:
    """Add a key to the schema and return it.

    Defining the same key again identically is a no-op (so modules may be
    reloaded); a conflicting definition is a ``ValueError``.
    """
    if kind not in KINDS:
        raise ValueError(f"{path}: kind must be one of {KINDS}, got {kind!r}")
    if not _NAME.fullmatch(path) or "" in path.split("/"):
        raise ValueError(f"invalid key path {path!r}")
    if "\n" in doc:
        raise ValueError(f"{path}: doc must be one line")
    if (kind == "choice") != bool(choices):
        raise ValueError(f"{path}: choices are required for, and only for, kind 'choice'")
    key = Key(path, kind, None, doc, tuple(c.lower() for c in choices), minimum, unit)
    try:
        key = Key(path, kind, key.parse(default), doc, key.choices, minimum, unit)
    except ValueError as exc:
        raise ValueError(f"{path}: bad default: {exc}") from None
    existing = KEYS.get(path)
    if existing is not None:
        if existing != key:
            raise ValueError(f"{path}: already defined differently: {existing}")
        return existing
    KEYS[path] = key
    return key


_MS = "milliseconds"

# The reference's keys (REFERENCE.md section 5).
define("tower/verbose", "bool", 0, "log tower activity")
define("tower/sub_address", "str", "tcp://*:5556", "tower XSUB bind address (beacons come in)")
define("tower/pub_address", "str", "tcp://*:5557", "tower XPUB bind address (beacons go out)")
define("beacon/verbose", "bool", 0, "log beacon activity")
define("beacon/interval", "int", 1000, "beacon period", minimum=1, unit=_MS)
define("beacon/timeout", "int", 4000, "peer expiry after its last beacon", minimum=1, unit=_MS)
define("beacon/sub_address", "str", "tcp://127.0.0.1:5556",
       "tower XSUB address(es) the beacon publishes to; a comma-separated list is allowed")
define("beacon/pub_address", "str", "tcp://127.0.0.1:5557",
       "tower XPUB address(es) the beacon subscribes to; a comma-separated list is allowed (list every tower in "
       "both keys, in the same order: a peer hears each beacon through every tower, and counts it once)")
define("beacon/address", "str", "",
       "host to advertise; empty = the local address of the route to the tower")
define("producer/verbose", "bool", 0, "log producer activity")
define("producer/head_interval", "int", 1000, "HEAD period", minimum=1, unit=_MS)
define("producer/high_watermark", "int", 1000000, "producer PUB send / SUB receive high-water mark",
       minimum=0, unit="messages")
define("producer/terminate_unacked", "bool", 0, "close at once even with unacknowledged records")
define("consumer/verbose", "bool", 0, "log consumer activity")
define("consumer/offset/reset", "choice", "latest",
       "where a consumer starts on a partition it has no offset for: latest, every record produced after it "
       "subscribed (rfc section 20); earliest, the oldest record kept",
       choices=("latest", "earliest"))
define("consumer/high_watermark", "int", 1000000, "consumer SUB receive / XPUB send high-water mark",
       minimum=0, unit="messages")
define("store/verbose", "bool", 0, "log store activity")
define("store/db", "str", "storedb", "LevelDB directory of the store (relative to the cwd)")
define("store/high_watermark", "int", 1000000, "store socket high-water marks",
       minimum=0, unit="messages")
define("test/verbose", "bool", 0, "log test peer activity")

# This project's extensions.
define("beacon/bind_address", "str", "",
       "interface data sockets bind to; empty = 127.0.0.1 if the advertised address is loopback, else *")
define("beacon/scoped", "bool", 1,
       "hear only the peers this peer needs (rfc 5.6: a consumer the producers of its topics and the stores, "
       "a producer the consumers of its topic and the stores) where every tower is a dafka-py one that "
       "scopes; 0 = hear every peer, as the reference does")
define("producer/min_acks", "int", 1,
       "distinct stores that must ACK a record before it is released; 0 = no-store mode",
       minimum=0, unit="stores")
define("producer/max_unacked", "int", 1000000, "records held unacknowledged before send blocks",
       minimum=1, unit="records")
define("producer/max_unacked_bytes", "int", 134217728,
       "content bytes held unacknowledged before send blocks", minimum=1, unit="bytes")
define("producer/max_record_bytes", "int", 1048576, "largest record content send accepts",
       minimum=0, unit="bytes")
define("producer/send_bytes", "int", 268435456,
       "records a producer's socket queues for one subscriber that reads too slowly; beyond it that subscriber's "
       "records are dropped and it fetches them again; libzmq counts messages, so the queue holds "
       "send_bytes / 256 KiB of them, the largest a dafka-py peer sends (and at most producer/high_watermark); "
       "keep it above producer/max_unacked_bytes, so that a store's queue never drops", minimum=262144, unit="bytes")
define("producer/send_timeout", "int", 60000, "how long send blocks while the buffer is full",
       minimum=0, unit=_MS)
define("producer/close_timeout", "int", 30000, "how long close waits for outstanding ACKs",
       minimum=0, unit=_MS)
define("producer/close_linger", "int", 2000,
       "how long close waits, after the flush, for the peers it knows of to connect, so that each hears its "
       "last HEAD (a reference store learns a partition only from a HEAD that reaches it); 0 = not at all",
       minimum=0, unit=_MS)
define("producer/fetch_inflight_bytes", "int", 33554432,
       "FETCH answers queued for one requester and not yet shown received by its next FETCH; "
       "0 = unlimited", minimum=0, unit="bytes")
define("producer/resume_timeout", "int", 10000,
       "how long a resuming producer (resume=True) waits for the stores' heads of its partition, and for "
       "another process beaconing its address to expire, before it gives up", minimum=1, unit=_MS)
define("consumer/receive_bytes", "int", 268435456,
       "records a consumer lets wait in its receive queue, per connected peer, before libzmq stops reading that "
       "peer (TCP then pushes back to it; what its queue drops is fetched again); libzmq counts messages, so "
       "the queue holds receive_bytes / 256 KiB of them, the largest a dafka-py peer sends (and at most "
       "consumer/high_watermark)", minimum=262144, unit="bytes")
define("consumer/fetch_max_bytes", "int", 8388608,
       "how much one FETCH asks for at most, estimated from the partition's recent records",
       minimum=1, unit="bytes")
define("consumer/fetch_retry", "int", 1000, "wait before an unanswered FETCH is sent again",
       minimum=1, unit=_MS)
define("consumer/heads_interval", "int", 1000,
       "while a known partition's producer is gone, ask the stores for the heads (GET-HEADS) after this "
       "long, then at doubling intervals up to 64 times it: its last records may have come with no HEAD",
       minimum=1, unit=_MS)
define("consumer/max_buffered", "int", 100000, "out-of-order records kept per partition",
       minimum=0, unit="records")
define("consumer/max_buffered_bytes", "int", 67108864,
       "out-of-order records kept per partition, in bytes (as many records of its first one's size): "
       "what a live producer sends ahead of a gap being fetched", minimum=0, unit="bytes")
define("consumer/batches", "bool", 1,
       "read a dafka-py producer's live records in batches (RECORDS); 0 = one RECORD per record")
define("consumer/bulk", "bool", 1,
       "ask dafka-py stores and producers for FETCH answers in bulk (DIRECT-RECORDS, DIRECT-PARTITIONS); "
       "0 = RFC 46 answers only")
define("consumer/store_times", "bool", 0,
       "give a record that has no timestamp of its own (rfc 18.4) the time a store received it, from the "
       "stamps of the store's answers (as Kafka's log time; the Kafka gateway's reads): a Python step a record")
define("consumer/group/auto_commit", "bool", 1,
       "a group member commits the positions it has returned every auto_commit_interval, when partitions "
       "move away from it and when it closes (kafka-python's enable_auto_commit)")
define("consumer/group/auto_commit_interval", "int", 5000, "how often a group member commits on its own",
       minimum=1, unit=_MS)
define("consumer/group/join_wait", "int", 200,
       "once the tower has told a new group member of the live peers, how long it listens to the group's "
       "heartbeats (and reads the stored commits) before it reads its share", minimum=0, unit=_MS)
define("store/sync", "bool", 0, "fsync every write to the database")
define("store/fetch_inflight_bytes", "int", 33554432,
       "FETCH answers queued for one requester and not yet shown received by its next FETCH; "
       "0 = unlimited", minimum=0, unit="bytes")
define("store/batches", "bool", 1,
       "the store's writer reads a dafka-py producer's live records in batches (RECORDS); 0 = one RECORD per record")
define("store/bulk", "bool", 1,
       "the store's writer asks other dafka-py stores and producers for FETCH answers in bulk; "
       "0 = RFC 46 answers only")
define("store/receive_bytes", "int", 33554432,
       "records the writer lets wait in its receive queue, per connected peer, before libzmq stops reading "
       "that peer (TCP then pushes back to it); libzmq counts messages, so the queue holds "
       "receive_bytes / 256 KiB of them, the largest a dafka-py peer sends (and at most store/high_watermark)"
       "; the writer also keeps at most this much of records that arrived out of order after a gap, all "
       "partitions together (with 100 bytes of objects counted each), and drops the rest to fetch them again",
       minimum=262144, unit="bytes")
define("store/batch_bytes", "int", 4194304,
       "record contents the writer gathers into one LevelDB write before it writes and ACKs them",
       minimum=1, unit="bytes")
define("store/write_buffer_bytes", "int", 33554432,
       "LevelDB's memtable (write_buffer_size); it holds two while one is written to disk", minimum=65536,
       unit="bytes")
define("store/cache_bytes", "int", 8388608, "LevelDB's block cache, for reads", minimum=0, unit="bytes")
define("store/block_bytes", "int", 32768,
       "LevelDB's block size (before compression): each open table keeps one index entry per block in memory",
       minimum=1024, unit="bytes")
define("store/compression", "choice", "snappy",
       "how LevelDB compresses the tables it writes: snappy (LevelDB's default, as the reference's) or none; "
       "a database holds blocks of either kind and any LevelDB reads both, so the key can change between runs",
       choices=("snappy", "none"))
define("store/max_open_files", "int", 1000,
       "tables LevelDB keeps open, each with its index in memory (its table cache)", minimum=74, unit="files")
define("store/memory/idle_ms", "int", 1000,
       "after this long without a write, the store writes its memtable to disk and gives freed memory back to "
       "the system (glibc malloc_trim), so a burst does not leave its RSS behind; -1 = never",
       minimum=-1, unit=_MS)
define("store/offsets/compact", "bool", 1,
       "in the offsets topics of consumer groups (__dafka_offsets.*), keep only each partition's newest record "
       "once it is a snapshot of the member's commits (rfc 14.6)")
define("store/offsets/retention_ms", "int", 604800000,
       "delete whole a partition of an offsets topic whose member has been silent this long, unless it is the "
       "topic's newest (Kafka's offsets.retention.minutes); -1 = never", minimum=-1, unit=_MS)
define("store/retention/ms", "int", -1, "age after which records are deleted; -1 = keep forever",
       minimum=-1, unit=_MS)
define("store/retention/bytes", "int", -1, "size per partition above which the oldest records "
       "are deleted; -1 = unlimited", minimum=-1, unit="bytes")
define("store/compaction/topics", "str", "",
       "compacted topics (rfc 19, Kafka's cleanup.policy=compact): comma-separated name patterns (fnmatch: "
       "cdc.*,prices); stores keep at least the newest record of each key of their partitions, and may drop "
       "older ones (retention still applies, as compact,delete). Every store of a cluster needs the same; "
       "empty = none")
define("store/compaction/tombstone_ms", "int", 86400000,
       "a compacted topic's tombstone (a keyed record with an empty value: the key was deleted) is dropped this "
       "long after a store received it, once no older record of its key is left (Kafka's delete.retention.ms)",
       minimum=0, unit=_MS)
define("store/compaction/budget", "int", 500,
       "record keys a store's compaction looks at in one step between two writes (a step every 5 ms while a "
       "pass goes on, every 50 ms while records come, and none while one waits): about 1 ms at 500; a step "
       "ends early once a record waits (it asks every 64 keys)", minimum=100, unit="keys")
define("store/replicas", "int", 0,
       "sharded stores (rfc 16): each partition lives on this many stores, placed by rendezvous hashing over "
       "the stores alive, and moved when stores come and go; 0 = every store holds every partition (RFC 46)",
       minimum=0, unit="stores")
define("store/rack", "str", "",
       "with store/replicas: the rack (or zone) of this store; a partition's replicas go to different racks "
       "where there are enough, as Kafka's broker.rack does")
define("store/dead_ms", "int", 30000,
       "with store/replicas: a store not heard this long is gone, and its partitions are copied to others; "
       "longer than beacon/timeout, so that a restart moves nothing", minimum=1, unit=_MS)
define("store/handoff_ms", "int", 30000,
       "with store/replicas: a store keeps a partition it no longer owns this long after every new owner "
       "holds it to its head, then deletes it", minimum=0, unit=_MS)
define("security/curve", "bool", 0, "encrypt and authenticate every socket with CurveZMQ")
define("security/cluster_key", "str", "",
       "secret key file (.key_secret) every bound socket of the cluster serves with")
define("security/peer_key", "str", "", "this peer's own secret key file (.key_secret), its identity")
define("security/authorized_keys", "str", "",
       "directory of the public keys (.key) of the peers allowed to connect")


def _suggest(path: str) -> str:
    """A ' (did you mean ...?)' hint for an unknown key, or ''."""
    matches = [k for k in KEYS if k.endswith("/" + path)]
    matches += [m for m in difflib.get_close_matches(path, KEYS, n=3) if m not in matches]
    if not matches:
        return ""
    return " (did you mean " + ", ".join(repr(m) for m in matches[:3]) + "?)"


def _is_section(path: str) -> bool:
    return any(k.startswith(path + "/") for k in KEYS)


# --------------------------------------------------------------------------
# ZPL
# --------------------------------------------------------------------------


def parse_zpl(text: str, filename: str = "<string>") -> dict[str, tuple[str, int]]:
    """Parse ZPL into ``{"a/b/c": (raw value, line number)}``.

    Nodes with ``= value`` are listed, and so are names alone on a line with
    no children (with value ``""``, as zconfig reads them); a section that
    only groups children is not.  Values are unquoted and stripped.
    """
    nodes: list[tuple[str, str | None, int]] = []  # (path, value or None, line)
    seen: dict[str, int] = {}
    parents: set[str] = set()
    stack: list[str] = []  # path of the latest node at each level

    def fail(lineno: int, reason: str, key: str | None = None) -> ConfigError:
        return ConfigError(reason, file=filename, line=lineno, key=key)

    for lineno, line in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        line = line.rstrip()
        body = line.lstrip(" ")
        if not body.strip() or body.lstrip().startswith("#"):
            continue
        indent = len(line) - len(body)
        if body[0] == "\t":
            raise fail(lineno, "tab in indentation (indent with 4 spaces per level)")
        if body[0].isspace():
            raise fail(lineno, f"invalid indentation character {body[0]!r} (use spaces)")
        if indent % 4:
            raise fail(lineno, f"indentation of {indent} spaces is not a multiple of 4")
        level = indent // 4
        if level > len(stack):
            raise fail(lineno, f"indented {indent} spaces, but at most {4 * len(stack)} are allowed "
                               "here (a child goes exactly 4 spaces deeper than its parent)")
        match = _NAME.match(body)
        if not match:
            raise fail(lineno, f"expected a name, got {body!r}")
        name = match.group()
        if "" in name.split("/"):
            raise fail(lineno, f"invalid name {name!r} (empty path segment)")
        path = f"{stack[level - 1]}/{name}" if level else name
        try:
            value = _parse_zpl_value(body[match.end():])
        except ValueError as exc:
            raise fail(lineno, str(exc), path) from None
        if path in seen:
            raise fail(lineno, f"duplicate key (already set on line {seen[path]})", path)
        seen[path] = lineno
        if level:
            parents.add(stack[level - 1])
        del stack[level:]
        stack.append(path)
        nodes.append((path, value, lineno))

    return {
        path: ("" if value is None else value, lineno)
        for path, value, lineno in nodes
        if value is not None or path not in parents
    }


def _parse_zpl_value(rest: str) -> str | None:
    """The value in ``rest`` (what follows the name), or None if there is no
    ``=``.  Raises ``ValueError`` with the reason for a syntax error."""
    rest = rest.lstrip()
    if not rest or rest.startswith("#"):
        return None
    if not rest.startswith("="):
        raise ValueError(f"expected '=' or end of line after the name, got {rest!r}")
    rest = rest[1:].lstrip()
    if rest[:1] in ("'", '"'):
        end = rest.find(rest[0], 1)
        if end < 0:
            raise ValueError(f"unterminated {rest[0]} quote")
        tail = rest[end + 1:].lstrip()
        if tail and not tail.startswith("#"):
            raise ValueError(f"unexpected text after the quoted value: {tail!r}")
        return rest[1:end]
    comment = _COMMENT.search(rest)
    return (rest[: comment.start()] if comment else rest).rstrip()


# --------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------


def parse_override(text: str) -> tuple[str, str]:
    """Split a command-line ``key=value`` into ``(key, value)``.

    The key must exist; the value is checked when it is applied.
    """
    key, eq, value = text.partition("=")
    key = key.strip()
    if not eq:
        raise ConfigError(f"expected key=value, got {text!r}", file="command line")
    if key not in KEYS:
        raise ConfigError("unknown key" + _suggest(key), file="command line", key=key)
    return key, value.strip()


class Config(Mapping[str, Any]):
    """An immutable mapping of every key in :data:`KEYS` to its typed value.

    ``Config()`` holds the defaults.  Two configs are equal when their values
    are; where each value came from (:meth:`source`) is not compared.
    """

    __slots__ = ("_values", "_sources")
    _values: Mapping[str, Any]
    _sources: Mapping[str, str]

    def __init__(self) -> None:
        self._init({k.path: k.default for k in KEYS.values()}, dict.fromkeys(KEYS, "default"))

    def _init(self, values: dict[str, object], sources: dict[str, str]) -> None:
        object.__setattr__(self, "_values", MappingProxyType(values))
        object.__setattr__(self, "_sources", MappingProxyType(sources))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Config is immutable; use with_overrides()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Config is immutable")

    # Mapping -------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        """The key's value, of the type its schema entry says (``int``, ``str``...)."""
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._values.items() if self._sources[k] != "default"}
        return f"Config({changed!r})"

    # Building ------------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        overrides: Mapping[str, object] | None = None,
    ) -> Config:
        """Defaults, then the ZPL file at ``path`` (if given), then ``overrides``."""
        if path is None:
            config = cls()
            return config.with_overrides(overrides) if overrides else config
        filename = os.fspath(path)
        try:
            with open(filename, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ConfigError("no such config file", file=filename) from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file ({exc.strerror})", file=filename) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ConfigError("not valid UTF-8", file=filename, line=line) from None
        return cls.from_text(text, filename, overrides)

    @classmethod
    def from_text(
        cls,
        text: str,
        filename: str = "<string>",
        overrides: Mapping[str, object] | None = None,
    ) -> Config:
        """Defaults, then the ZPL ``text`` (errors name ``filename``), then ``overrides``."""
        config = cls()
        values = dict(config._values)
        sources = dict(config._sources)
        for path, (raw, lineno) in parse_zpl(text, filename).items():
            key = KEYS.get(path)
            if key is None:
                if not (raw == "" and _is_section(path)):
                    log.warning("%s:%d: unknown key %r ignored%s",
                                filename, lineno, path, _suggest(path))
                continue
            try:
                values[path] = key.parse(raw)
            except ValueError as exc:
                raise ConfigError(str(exc), file=filename, line=lineno, key=path) from None
            sources[path] = f"{filename}:{lineno}"
        config._init(values, sources)
        return config.with_overrides(overrides) if overrides else config

    def with_overrides(self, overrides: Mapping[str, object], source: str = "override") -> Config:
        """A copy with ``overrides`` applied; values may be typed or strings to
        parse.  An unknown key or bad value is a :class:`ConfigError` naming
        ``source``."""
        values = {k.path: k.default for k in KEYS.values()}
        sources = dict.fromkeys(KEYS, "default")
        values.update(self._values)
        sources.update(self._sources)
        for path, value in overrides.items():
            key = KEYS.get(path)
            if key is None:
                raise ConfigError("unknown key" + _suggest(path), file=source, key=path)
            try:
                values[path] = key.parse(value)
            except ValueError as exc:
                raise ConfigError(str(exc), file=source, key=path) from None
            sources[path] = source
        config = object.__new__(type(self))
        config._init(values, sources)
        return config

    # Reporting -----------------------------------------------------------

    def source(self, key: str) -> str:
        """Where ``key``'s value came from: ``"default"``, ``"file:line"``,
        or the source given to :meth:`with_overrides`."""
        return self._sources[key]

    def to_zpl(self) -> str:
        """Every key as a ZPL file, with each key's doc as a comment; it loads
        back into an equal config."""
        tree: dict[str | None, Any] = {}
        for path in self._values:
            node = tree
            for name in path.split("/"):
                node = node.setdefault(name, {})
            node[None] = path  # the None entry marks a node with a value
        lines = ["#   Dafka configuration"]
        self._dump(tree, 0, lines)
        return "\n".join(lines) + "\n"

    def _dump(self, tree: dict[str | None, Any], level: int, lines: list[str]) -> None:
        indent = "    " * level
        for name, node in tree.items():
            if name is None:
                continue
            path = node.get(None)
            if path is None:
                lines.append(f"{indent}{name}")
            else:
                key = KEYS[path]
                unit = f" ({key.unit})" if key.unit else ""
                lines.append(f"{indent}#   {key.doc}{unit}")
                lines.append(f"{indent}{name} = {_format_value(key, self._values[path])}")
            self._dump(node, level + 1, lines)


ConfigLike = Union[Config, Mapping[str, object], str, "os.PathLike[str]", None]


def as_config(config: ConfigLike) -> Config:
    """A :class:`Config` from a Config, a dict of overrides, a ZPL file path, or None (defaults)."""
    if isinstance(config, Config):
        return config
    if config is None:
        return Config.load()
    if isinstance(config, (str, os.PathLike)):
        return Config.load(config)
    return Config.load(overrides=config)
