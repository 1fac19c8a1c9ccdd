"""The options of the ``dafka`` Spark source and sink, parsed and checked on
the driver so that a mistake is reported at planning time, in words that say
what to change.

Everything here is plain data (strings, ints, dicts) so that it pickles to the
executors; :meth:`Options.config` rebuilds the :class:`dafka.Config` there.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Mapping

from dafka.core.endpoints import parse_tcp_endpoint, split_endpoints
from dafka.config import KEYS, Config, ConfigError
from dafka.errors import DafkaError

EARLIEST = -2
LATEST = -1

DEFAULT_TOWER_SUB_PORT = 5556  # the reference's tower/sub_address port
DEFAULT_TOWER_PUB_PORT = 5557  # the reference's tower/pub_address port

CONFIG_PREFIX = "dafka."  # option "dafka.<key>" sets config key <key>, e.g. dafka.beacon/address

# Every option, by its lower-cased name (Spark lower-cases option names), with
# the spelling used in messages and documentation.
OPTIONS = {
    name.lower(): name
    for name in (
        "path", "tower", "towerSub", "config", "topic",
        "startingOffsets", "endingOffsets", "maxRecordsPerPartition", "maxRecordsPerTrigger",
        "failOnDataLoss", "minAcks",
        "towerTimeoutMs", "discoveryTimeoutMs", "fetchTimeoutMs", "lockTimeoutMs", "flushTimeoutMs",
    )
}
# Options Spark itself passes to sources and sinks; accepted and ignored.
SPARK_OPTIONS = {"checkpointlocation", "queryname", "paths"}

DEFAULT_TIMEOUTS_MS = {
    "towertimeoutms": 5_000,  # a tower must answer within this
    "discoverytimeoutms": 3_000,  # longest wait for the stores' heads at planning
    "fetchtimeoutms": 60_000,  # a task fails after this long without a record
    "locktimeoutms": 30_000,  # path mode: wait for a sibling task holding the directory
    "flushtimeoutms": 60_000,  # a write task fails if its records are not acked by then
}


class DafkaSparkError(DafkaError):
    """Base class of the errors of the Spark connector."""


class OptionError(DafkaSparkError, ValueError):
    """A missing, unknown or malformed option; the message says what to fix."""


@dataclass(frozen=True)
class OffsetSpec:
    """``startingOffsets``/``endingOffsets``: a default (:data:`EARLIEST` or
    :data:`LATEST`) plus explicit offsets for some partitions."""

    default: int
    partitions: dict[str, int] = field(default_factory=dict)

    def for_partition(self, partition: str) -> int:
        return self.partitions.get(partition, self.default)


@dataclass(frozen=True)
class Options:
    """The parsed options of one read or write."""

    mode: str  # "read", "stream" or "write"
    topic: str | None
    path: str | None
    tower_pub: str | None
    tower_sub: str | None
    config_text: str | None
    config_name: str | None
    overrides: dict[str, str]
    starting: OffsetSpec
    ending: OffsetSpec
    max_records_per_partition: int | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    min_acks: int | None
    timeouts_ms: dict[str, int]

    @property
    def live(self) -> bool:
        return self.path is None

    def timeout(self, name: str) -> float:
        """A timeout in seconds, by lower-cased option name."""
        return self.timeouts_ms[name.lower()] / 1000.0

    def config(self) -> Config:
        """The dafka configuration for live peers: the ``config`` file, then
        ``dafka.*`` options, then the tower options and ``minAcks``."""
        try:
            if self.config_text is not None:
                base = Config.from_text(self.config_text, self.config_name or "config")
            else:
                base = Config()
            return base.with_overrides(self.overrides, source="spark option")
        except ConfigError as exc:
            raise OptionError(f"bad dafka configuration: {exc}") from None

    def where(self) -> str:
        """Where the data comes from, for messages."""
        if self.path is not None:
            return f"path={self.path}"
        return f"tower={self.tower_pub} (towerSub={self.tower_sub})"


def parse(options: Mapping[str, str], mode: str) -> Options:
    """Check and parse the user's options for ``mode`` ("read", "stream", "write")."""
    opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}
    _check_names(opts)

    topic = opts.get("topic", "").strip() or None
    if topic is None and mode != "write":
        raise OptionError('option "topic" is required: .option("topic", "<topic name>")')
    if topic is not None:
        raw = topic.encode("utf-8", "surrogateescape")
        if b"\0" in raw or len(raw) > 255:
            raise OptionError(f"topic {topic!r} is not a valid Dafka topic (at most 255 bytes, no NUL byte)")

    path = opts.get("path", "").strip() or None
    tower = opts.get("tower", "").strip() or None
    tower_sub = opts.get("towersub", "").strip() or None
    if path is not None and (tower is not None or tower_sub is not None):
        raise OptionError('give either "path" (read a store\'s LevelDB directory) or "tower" '
                          '(read live through the Dafka protocol), not both')
    if path is None and tower is None:
        if mode == "write":
            raise OptionError('option "tower" is required to write: .option("tower", "tcp://HOST:5557") '
                              '(the tower\'s XPUB; see also "towerSub")')
        raise OptionError('say where to read from: .option("path", "<store LevelDB directory>") or '
                          '.option("tower", "tcp://HOST:5557") (the tower\'s XPUB; see also "towerSub")')
    if path is not None and mode == "write":
        raise OptionError('"path" cannot be written to: records enter a store through the Dafka protocol; '
                          'use .option("tower", ...) to write')
    if path is not None:
        path = os.path.abspath(os.path.expanduser(path))
    if tower_sub is not None and tower is None:
        raise OptionError('"towerSub" needs "tower" (the tower\'s XPUB address) as well')
    pub = sub = None
    if tower is not None:
        sub, pub = parse_tower(tower, tower_sub)

    config_text = config_name = None
    if opts.get("config", "").strip():
        config_name = os.path.abspath(os.path.expanduser(opts["config"].strip()))
        try:
            with open(config_name, encoding="utf-8") as f:
                config_text = f.read()
        except OSError as exc:
            raise OptionError(f'option "config": cannot read the dafka config file {config_name!r}: '
                              f'{exc.strerror or exc}') from None

    overrides: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith(CONFIG_PREFIX):
            overrides[key[len(CONFIG_PREFIX):]] = value
    if pub is not None:
        overrides["beacon/pub_address"] = pub
        overrides["beacon/sub_address"] = sub

    min_acks = _int(opts, "minacks", minimum=0) if mode == "write" else None
    if min_acks is not None:
        overrides["producer/min_acks"] = str(min_acks)
    elif "minacks" in opts and mode != "write":
        raise OptionError('"minAcks" only applies to writing')

    timeouts = dict(DEFAULT_TIMEOUTS_MS)
    for name in DEFAULT_TIMEOUTS_MS:
        value = _int(opts, name, minimum=1)
        if value is not None:
            timeouts[name] = value

    starting_default = EARLIEST if mode == "read" else LATEST
    starting = parse_offsets(opts.get("startingoffsets"), "startingOffsets", topic, starting_default,
                             allow_earliest=True)
    if mode == "stream" and "endingoffsets" in opts:
        raise OptionError('"endingOffsets" only applies to batch reads (a stream never ends); '
                          'use trigger(availableNow=True) to stop at the current end')
    ending = parse_offsets(opts.get("endingoffsets"), "endingOffsets", topic, LATEST, allow_earliest=False)

    per_partition = _int(opts, "maxrecordsperpartition", minimum=1)
    per_trigger = _int(opts, "maxrecordspertrigger", minimum=1)
    if per_trigger is not None and mode != "stream":
        raise OptionError('"maxRecordsPerTrigger" only applies to streaming reads (spark.readStream)')

    parsed = Options(
        mode=mode,
        topic=topic,
        path=path,
        tower_pub=pub,
        tower_sub=sub,
        config_text=config_text,
        config_name=config_name,
        overrides=overrides,
        starting=starting,
        ending=ending,
        max_records_per_partition=per_partition,
        max_records_per_trigger=per_trigger,
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        min_acks=min_acks,
        timeouts_ms=timeouts,
    )
    if parsed.live:
        parsed.config()  # a bad config file or dafka.* option fails here, on the driver
    return parsed


def _check_names(opts: Mapping[str, str]) -> None:
    for key in opts:
        if key in OPTIONS or key in SPARK_OPTIONS or key.startswith("spark."):
            continue
        if key.startswith(CONFIG_PREFIX):
            path = key[len(CONFIG_PREFIX):]
            if path not in KEYS:
                close = difflib.get_close_matches(path, KEYS, n=1)
                hint = f" (did you mean {', '.join(CONFIG_PREFIX + c for c in close)}?)" if close else ""
                raise OptionError(f'option "{key}": {path!r} is not a dafka configuration key{hint}')
            continue
        close = difflib.get_close_matches(key, OPTIONS, n=1, cutoff=0.7)
        hint = f" (did you mean {', '.join(repr(OPTIONS[c]) for c in close)}?)" if close else ""
        known = ", ".join(sorted(OPTIONS.values(), key=str.lower))
        raise OptionError(f"unknown option {key!r}{hint}; the dafka source knows: {known}, "
                          f"and dafka.<config key> (e.g. dafka.beacon/address)")


def _int(opts: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = opts.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f'option "{OPTIONS[name]}" must be an integer, got {text!r}') from None
    if value < minimum:
        raise OptionError(f'option "{OPTIONS[name]}" must be at least {minimum}, got {value}')
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    text = opts.get(name)
    if text is None or text.strip() == "":
        return default
    word = text.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    raise OptionError(f'option "{OPTIONS[name]}" must be true or false, got {text!r}')


def _check_endpoints(value: str, what: str) -> str:
    endpoints = split_endpoints(value)
    if not endpoints:
        raise OptionError(f"{what}: no endpoint given")
    for endpoint in endpoints:
        if endpoint.startswith(("ipc://", "inproc://")):
            continue
        try:
            host, port = parse_tcp_endpoint(endpoint)
        except ValueError as exc:
            raise OptionError(f"{what}: {exc} (expected tcp://HOST:PORT)") from None
        if port is None:
            raise OptionError(f"{what}: {endpoint!r} needs a port number (tcp://HOST:PORT)")
    return ",".join(endpoints)


def parse_tower(tower: str, tower_sub: str | None) -> tuple[str, str]:
    """``(sub, pub)``: where beacons go (the tower's XSUB, ``beacon/sub_address``)
    and where they come from (its XPUB, ``beacon/pub_address``).

    * ``tower=tcp://H:P`` and ``towerSub=tcp://H:S``: explicit (each may be a
      comma-separated list of towers);
    * ``tower=SUB,PUB``: both in one option, sub first like the tools' ``--sub``/``--pub``;
    * ``tower=HOST`` (no scheme, no port): the reference's ports, 5556 and 5557;
    * ``tower=tcp://H:5557`` alone: the XSUB is taken to be ``tcp://H:5556``.
    """
    if tower_sub is not None:
        return (_check_endpoints(tower_sub, 'option "towerSub"'), _check_endpoints(tower, 'option "tower"'))
    parts = [p.strip() for p in tower.split(",") if p.strip()]
    if len(parts) == 2:
        return (_check_endpoints(parts[0], 'option "tower" (first of SUB,PUB)'),
                _check_endpoints(parts[1], 'option "tower" (second of SUB,PUB)'))
    if len(parts) != 1:
        raise OptionError(f'option "tower": expected tcp://HOST:PUB_PORT, "SUB,PUB" or a host name, got {tower!r}; '
                          'for several towers give towerSub as well')
    one = parts[0]
    if "://" not in one:
        if ":" in one or "/" in one or not one:
            raise OptionError(f'option "tower": {one!r} is neither an endpoint (tcp://HOST:PORT) nor a host name')
        return (f"tcp://{one}:{DEFAULT_TOWER_SUB_PORT}", f"tcp://{one}:{DEFAULT_TOWER_PUB_PORT}")
    pub = _check_endpoints(one, 'option "tower"')
    host, port = parse_tcp_endpoint(pub)
    if port != DEFAULT_TOWER_PUB_PORT:
        raise OptionError(
            f'option "tower" = {pub} is the tower\'s XPUB (beacons come from it); also say where its XSUB '
            f'is (beacons go to it): .option("towerSub", "tcp://{host}:PORT"), or tower="SUB,PUB"')
    if ":" in host:
        host = f"[{host}]"
    return (f"tcp://{host}:{DEFAULT_TOWER_SUB_PORT}", pub)


def parse_offsets(text: str | None, name: str, topic: str | None, default: int, *, allow_earliest: bool) -> OffsetSpec:
    """``earliest``, ``latest`` or JSON ``{"<topic>": {"<partition>": offset}}``
    with -2 = earliest and -1 = latest (as in Spark's Kafka source)."""
    if text is None or not text.strip():
        return OffsetSpec(default)
    word = text.strip().lower()
    if word == "earliest":
        if not allow_earliest:
            raise OptionError(f'"{name}" cannot be earliest; use "latest" or JSON offsets')
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    example = f'{{"{topic or "topic"}": {{"<partition address>": 42}}}}'
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OptionError(f'"{name}" is neither "earliest", "latest" nor JSON like {example}: {exc}') from None
    if not isinstance(data, dict):
        raise OptionError(f'"{name}" must be a JSON object like {example}, got {text!r}')
    partitions: dict[str, int] = {}
    for key, value in data.items():
        if key != topic:
            raise OptionError(f'"{name}" names topic {key!r}, but option "topic" is {topic!r}')
        if not isinstance(value, dict):
            raise OptionError(f'"{name}": the value for topic {key!r} must be an object of '
                              f'partition -> offset, like {example}')
        for partition, offset in value.items():
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise OptionError(f'"{name}": offset of partition {partition!r} must be an integer, got {offset!r}')
            if offset < EARLIEST or (offset == EARLIEST and not allow_earliest):
                allowed = "-2 (earliest), -1 (latest)" if allow_earliest else "-1 (latest)"
                raise OptionError(f'"{name}": offset {offset} of partition {partition!r} is invalid; '
                                  f'use an offset >= 0, or {allowed}')
            partitions[partition] = offset
    return OffsetSpec(default, partitions)
