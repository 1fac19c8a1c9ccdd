"""Prometheus metrics of dafka-py peers.

A collector reads the counters the peers keep anyway (their ``stats()`` and
states) when Prometheus scrapes, so the per-record path pays nothing for
metrics.  Applications expose their own peers with :func:`register` and
:func:`serve`; the daemons and console tools do it with ``--metrics-port``::

    from dafka import Consumer, metrics
    consumer = Consumer("weather")
    metrics.register(consumer)            # Producer, Consumer, Store, Tower, or their dafka.aio wrappers
    metrics.serve(9100)                   # http://127.0.0.1:9100/metrics

Every metric is named ``dafka_...`` and labelled with the ``role`` and the
``peer`` address of the peer it comes from (a process may hold several).
Counters (``_total``) start at 0 with the process and never go down while it
lives.  Per-partition series are capped at ``partitions_cap`` per peer (the
partitions with the highest values first); ``dafka_unlabelled_partitions``
counts the rest, and the unlabelled ``dafka_consumer_lag_max`` covers all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .discovery import peer_info

PARTITIONS_CAP = 100

# name -> (type, help, extra label names); every metric also has the labels role and peer.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "dafka_records_published": ("counter", "records a producer published", ("topic",)),
    "dafka_published_bytes": ("counter", "record content bytes a producer published", ("topic",)),
    "dafka_records_acked": ("counter", "records acked by producer/min_acks stores", ("topic",)),
    "dafka_records_stored": ("counter", "records a store wrote to its database", ()),
    "dafka_stored_bytes": ("counter", "record content bytes a store wrote to its database", ()),
    "dafka_acks_sent": ("counter", "ACKs a store sent", ()),
    "dafka_records_delivered": ("counter", "records a consumer took in, in order, once each", ()),
    "dafka_delivered_bytes": ("counter", "record content bytes a consumer took in", ()),
    "dafka_records_lost": ("counter", "offsets a consumer went past because nobody held them any more "
                           "(a store's retention, or a producer without stores that let them go)", ()),
    "dafka_records_answered": ("counter", "records sent in answer to FETCHes", ()),
    "dafka_answered_bytes": ("counter", "bytes of FETCH answers sent, framing included", ()),
    "dafka_fetches_received": ("counter", "FETCHes received", ()),
    "dafka_fetches_sent": ("counter", "FETCHes sent", ()),
    "dafka_fetches_unheard": ("counter", "FETCHes dropped because nobody subscribed to their answers", ()),
    "dafka_malformed_frames": ("counter", "malformed messages dropped", ()),
    "dafka_write_errors": ("counter", "failed database writes (the store retries them)", ()),
    "dafka_live_peers": ("gauge", "peers this peer is connected to (a tower: the live peers it relays)", ()),
    "dafka_unacked_records": ("gauge", "records a producer holds until stores ack them", ("topic",)),
    "dafka_inflight_bytes": ("gauge", "FETCH answer bytes queued for requesters (in-flight budget in use)", ()),
    "dafka_store_db_bytes": ("gauge", "size of the store's database directory on disk", ()),
    "dafka_store_level_bytes": ("gauge", "size of each LevelDB level that holds files (compaction at work)",
                                ("level",)),
    "dafka_store_under_replicated_partitions": ("gauge", "partitions a sharded store knows of with fewer than "
                                                "store/replicas live, complete copies (rfc 16)", ()),
    "dafka_store_partitions_moved": ("counter", "partitions a sharded store took up (in) or handed over and "
                                     "deleted (out)", ("direction",)),
    "dafka_store_compaction_deleted": ("counter", "records of compacted topics a store deleted: superseded by a "
                                       "newer record of their key, or old tombstones (rfc 19)", ()),
    "dafka_store_compaction_passes": ("counter", "compaction passes a store finished", ()),
    "dafka_store_compaction_dirty": ("gauge", "records of compacted topics written since their partition's last "
                                     "compaction pass ended", ()),
    "dafka_stored_head": ("gauge", "highest sequence a store has written, per partition", ("topic", "partition")),
    "dafka_producer_head": ("gauge", "highest sequence a producer published", ("topic", "partition")),
    "dafka_consumer_lag": ("gauge", "known head minus position, per partition", ("topic", "partition")),
    "dafka_consumer_lag_max": ("gauge", "the highest lag over all of a consumer's partitions", ()),
    "dafka_group_members": ("gauge", "live members of the consumer's group in its view, itself included", ("group",)),
    "dafka_group_partitions": ("gauge", "partitions the group member reads", ("group",)),
    "dafka_group_rebalances": ("counter", "times the member's view of its group changed", ("group",)),
    "dafka_cdc_changes": ("counter", "row changes a CDC connector captured from the commit log", ()),
    "dafka_cdc_snapshot_rows": ("counter", "rows a CDC connector read in its bootstrap", ()),
    "dafka_cdc_transactions": ("counter", "transactions a CDC connector captured", ()),
    "dafka_cdc_records_acked": ("counter", "CDC records acked by producer/min_acks stores", ()),
    "dafka_cdc_confirmed_lsn": ("gauge", "the LSN the CDC connector's slot confirmed", ()),
    "dafka_cdc_lag_bytes": ("gauge", "WAL bytes between the server's end and the slot's confirmed LSN", ()),
    "dafka_cdc_malformed": ("counter", "replication messages a CDC connector could not capture", ()),
    "dafka_cdc_reconnects": ("counter", "times a CDC connector reconnected to its database", ()),
    "dafka_mirror_records": ("counter", "records a mirror copied, acked by producer/min_acks target stores", ()),
    "dafka_mirror_bytes": ("counter", "record content bytes a mirror published into the target", ()),
    "dafka_mirror_lag_records": ("gauge", "records the source holds that the target has not acked yet",
                                 ("topic", "partition")),
    "dafka_mirror_lag_seconds": ("gauge", "how long ago the mirror learnt of the oldest record not copied yet",
                                 ("topic", "partition")),
    "dafka_mirror_partitions": ("gauge", "source partitions the mirror met, by state (copying, looped, ...)",
                                ("state",)),
    "dafka_mirror_conflicts": ("counter", "partitions a mirror found written by another writer (not copied)", ()),
    "dafka_mirror_gaps": ("counter", "partitions a mirror stopped: the source lost records it needed", ()),
    "dafka_kafka_connections": ("counter", "Kafka client connections a gateway accepted", ()),
    "dafka_kafka_requests": ("counter", "Kafka requests a gateway answered", ()),
    "dafka_kafka_malformed": ("counter", "Kafka requests a gateway could not parse (their connection closed)", ()),
    "dafka_kafka_records_in": ("counter", "records Kafka producers wrote through a gateway", ()),
    "dafka_kafka_records_out": ("counter", "records a gateway returned to Kafka consumers", ()),
    "dafka_kafka_duplicates": ("counter", "idempotent batches a gateway answered again without storing them twice", ()),
    "dafka_kafka_authentication_failed": ("counter", "Kafka connections a gateway closed for failing SASL "
                                          "(a wrong password or proof, a request before authenticating, an "
                                          "oversized SASL frame)", ()),
    "dafka_kafka_denied": ("counter", "topics and groups Kafka requests named that their principal may not use "
                                      "(dafka kafka --acl)", ()),
    "dafka_kafka_group_members": ("gauge", "members of a Kafka group the gateway coordinates", ("group",)),
    "dafka_kafka_group_lag": ("gauge", "records of a partition after a Kafka group's commit (its lag)",
                              ("group", "topic", "partition")),
    "dafka_unlabelled_partitions": ("gauge", "partitions left out of a per-partition metric by the cap", ("metric",)),
}


class _Families:
    """The metric families of one scrape, filled peer by peer."""

    def __init__(self) -> None:
        self._families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        family = self._families.get(name)
        if family is None:
            kind, doc, extra = METRICS[name]
            make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = self._families[name] = make(name, doc, labels=["role", "peer", *extra])
        family.add_metric(list(labels.values()), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


class PeerCollector(Collector):
    """Reads the registered peers at scrape time."""

    def __init__(self, partitions_cap: int = PARTITIONS_CAP) -> None:
        if partitions_cap < 0:
            raise ValueError(f"partitions_cap must be at least 0, got {partitions_cap}")
        self.partitions_cap = partitions_cap
        self._peers: list[Any] = []
        self._lock = threading.Lock()

    def add(self, *peers: Any) -> None:
        """Collect these peers too (Producer, Consumer, Store, Tower, their dafka.aio wrappers...)."""
        with self._lock:
            for peer in peers:
                if type(peer).__name__ not in _READERS:  # a dafka.aio wrapper: its peer
                    peer = getattr(peer, "_consumer", None) or getattr(peer, "_producer", None) or peer
                kind = type(peer).__name__
                if kind not in _READERS:
                    raise TypeError(f"no metrics for {type(peer).__name__}: register a Producer, Consumer, Store, "
                                    "Tower, their dafka.aio wrappers, a CDC connector or a Mirror")
                self._peers.append(peer)

    def remove(self, peer: Any) -> None:
        """Stop collecting ``peer``."""
        with self._lock:
            self._peers = [p for p in self._peers if p is not peer]

    def collect(self) -> Iterator[Metric]:
        """The metric families, read from the peers' counters now (prometheus_client calls it at each scrape)."""
        families = _Families()
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            _READERS[type(peer).__name__](peer, families, self.partitions_cap)
        return iter(families)


def register(*peers: Any, registry: CollectorRegistry = REGISTRY,
             partitions_cap: int = PARTITIONS_CAP) -> PeerCollector:
    """Expose ``peers`` (Producer, Consumer, Store, Tower, AsyncProducer,
    AsyncConsumer) in ``registry``; returns the collector, whose ``add``
    takes more peers later."""
    collector = PeerCollector(partitions_cap)
    collector.add(*peers)
    registry.register(collector)
    return collector


def serve(port: int, address: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY) -> Any:
    """Serve ``registry`` over HTTP at ``http://address:port/metrics`` from a
    daemon thread; returns the server (``shutdown()`` stops it)."""
    started = start_http_server(port, addr=address, registry=registry)
    peer_info.set_metrics_url(f"http://{address}:{port}/metrics")
    return started[0] if isinstance(started, tuple) else started


# -- what each kind of peer exposes -----------------------------------------------------------------


def _capped(families: _Families, name: str, base: dict[str, str], rows: Iterable[tuple[str, str, int]],
            cap: int) -> None:
    """Per-partition ``rows`` (topic, partition, value), the highest ``cap`` labelled."""
    ordered = sorted(rows, key=lambda row: row[2], reverse=True)
    for topic, partition, value in ordered[:cap]:
        families.add(name, {**base, "topic": topic, "partition": partition}, value)
    families.add("dafka_unlabelled_partitions", {**base, "metric": name}, max(0, len(ordered) - cap))


def _producer(producer: Any, families: _Families, cap: int) -> None:
    stats = producer.stats()
    base = {"role": "producer", "peer": producer.address}
    topic = {**base, "topic": producer.topic}
    families.add("dafka_records_published", topic, stats["sent"])
    families.add("dafka_published_bytes", topic, stats["sent_bytes"])
    families.add("dafka_records_acked", topic, stats["acked"])
    families.add("dafka_unacked_records", topic, stats["unacked"])
    families.add("dafka_records_answered", base, stats["records_answered"])
    families.add("dafka_answered_bytes", base, stats["bytes_answered"])
    families.add("dafka_fetches_received", base, stats["fetches_received"])
    families.add("dafka_fetches_unheard", base, stats["fetches_unheard"])
    families.add("dafka_malformed_frames", base, stats["malformed"])
    families.add("dafka_live_peers", base, stats["peers"])
    families.add("dafka_inflight_bytes", base, stats["inflight_bytes"])
    families.add("dafka_producer_head", {**topic, "partition": producer.address}, stats["sent"] - 1)


def _consumer(consumer: Any, families: _Families, cap: int) -> None:
    stats = consumer.stats()
    base = {"role": "consumer", "peer": consumer.address}
    families.add("dafka_records_delivered", base, stats["delivered"])
    families.add("dafka_delivered_bytes", base, stats["delivered_bytes"])
    families.add("dafka_records_lost", base, stats["records_lost"])
    families.add("dafka_fetches_sent", base, stats["fetches_sent"])
    families.add("dafka_malformed_frames", base, stats["malformed"])
    families.add("dafka_live_peers", base, stats["peers"])
    lags = consumer.lags()
    _capped(families, "dafka_consumer_lag", base, [(t, p, lag) for (t, p), lag in lags.items()], cap)
    families.add("dafka_consumer_lag_max", base, max(lags.values(), default=0))
    if "group_members" in stats:
        group = {**base, "group": consumer._group.state.group}
        families.add("dafka_group_members", group, stats["group_members"])
        families.add("dafka_group_partitions", group, stats["group_partitions"])
        families.add("dafka_group_rebalances", group, stats["group_rebalances"])


def _store(store: Any, families: _Families, cap: int) -> None:
    stats = store.stats()
    writer = {"role": "store-writer", "peer": store.writer_address}
    reader = {"role": "store-reader", "peer": store.reader_address}
    families.add("dafka_records_stored", writer, stats["records_written"])
    families.add("dafka_stored_bytes", writer, stats["bytes_written"])
    families.add("dafka_acks_sent", writer, stats["acks_sent"])
    families.add("dafka_fetches_sent", writer, stats["fetches_sent"])
    families.add("dafka_write_errors", writer, stats["write_errors"])
    families.add("dafka_malformed_frames", writer, stats["writer_malformed"])
    families.add("dafka_live_peers", writer, stats["writer_peers"])
    families.add("dafka_records_answered", reader, stats["records_served"])
    families.add("dafka_answered_bytes", reader, stats["bytes_served"])
    families.add("dafka_fetches_received", reader, stats["fetches_received"])
    families.add("dafka_fetches_unheard", reader, stats["fetches_unheard"])
    families.add("dafka_malformed_frames", reader, stats["reader_malformed"])
    families.add("dafka_live_peers", reader, stats["reader_peers"])
    families.add("dafka_inflight_bytes", reader, stats["inflight_bytes"])
    families.add("dafka_store_db_bytes", writer, directory_bytes(store.path))
    if stats["sharded"]:
        families.add("dafka_store_under_replicated_partitions", writer, stats["under_replicated"])
        families.add("dafka_store_partitions_moved", dict(writer, direction="in"), stats["moves_in"])
        families.add("dafka_store_partitions_moved", dict(writer, direction="out"), stats["moves_out"])
    families.add("dafka_store_compaction_deleted", writer, stats["compaction_deleted"])
    families.add("dafka_store_compaction_passes", writer, stats["compaction_passes"])
    families.add("dafka_store_compaction_dirty", writer, stats["compaction_dirty"])
    for level, size in store.level_bytes().items():
        families.add("dafka_store_level_bytes", dict(writer, level=str(level)), size)
    _capped(families, "dafka_stored_head", writer, [(t, p, head) for (t, p), head in store.heads().items()], cap)


def _tower(tower: Any, families: _Families, cap: int) -> None:
    base = {"role": "tower", "peer": tower.pub_endpoint}
    families.add("dafka_live_peers", base, len(tower.peers()))
    families.add("dafka_malformed_frames", base, tower.state.malformed)


def directory_bytes(path: str) -> int:
    """Bytes of every file under ``path`` (a store's database)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass  # a file LevelDB removed meanwhile (compaction)
    return total


def _cdc(capture: Any, families: _Families, cap: int) -> None:
    stats = capture.stats
    base = {"role": "cdc", "peer": capture.label}
    families.add("dafka_cdc_changes", base, stats.changes)
    families.add("dafka_cdc_snapshot_rows", base, stats.snapshot_rows)
    families.add("dafka_cdc_transactions", base, stats.transactions)
    families.add("dafka_cdc_records_acked", base, capture.acked())
    families.add("dafka_cdc_confirmed_lsn", base, stats.confirmed_lsn)
    families.add("dafka_cdc_lag_bytes", base, stats.lag_bytes)
    families.add("dafka_cdc_malformed", base, stats.malformed + stats.unexpected)
    families.add("dafka_cdc_reconnects", base, stats.reconnects)
    for producer in list(capture.producers()):
        _producer(producer, families, cap)


def _mirror(mirror: Any, families: _Families, cap: int) -> None:
    state = mirror.state
    base = {"role": "mirror", "peer": mirror.name}
    families.add("dafka_mirror_records", base, state.copied)
    families.add("dafka_mirror_bytes", base, mirror.stats.bytes)
    families.add("dafka_mirror_conflicts", base, state.conflicts)
    families.add("dafka_mirror_gaps", base, state.gaps)
    for phase, count in state.phases().items():
        families.add("dafka_mirror_partitions", {**base, "state": phase}, count)
    rows = [r for r in mirror.partitions() if r["phase"] == "copying"]
    _capped(families, "dafka_mirror_lag_records", base, [(r["topic"], r["partition"], r["lag"]) for r in rows], cap)
    _capped(families, "dafka_mirror_lag_seconds", base,
            [(r["topic"], r["partition"], r["lag_seconds"]) for r in rows], cap)
    if mirror.consumer is not None:
        _consumer(mirror.consumer, families, cap)


def _kafka_gateway(gateway: Any, families: _Families, cap: int) -> None:
    c = gateway.counters
    base = {"role": "kafka", "peer": f"{gateway.address}:{gateway.port}"}
    for name in ("connections", "requests", "malformed", "records_in", "records_out", "duplicates",
                 "authentication_failed", "denied"):
        families.add(f"dafka_kafka_{name}", base, getattr(c, name))
    for group, members in gateway.group_members().items():
        families.add("dafka_kafka_group_members", {**base, "group": group}, members)
    for group, topic, index, lag in gateway.group_lags():
        families.add("dafka_kafka_group_lag", {**base, "group": group, "topic": topic, "partition": str(index)}, lag)
    for producer in list(gateway.producers.values()):
        _producer(producer._producer, families, cap)


_READERS = {"Producer": _producer, "Consumer": _consumer, "Store": _store, "Tower": _tower,
            "PostgresCapture": _cdc, "MysqlCapture": _cdc,
            "Mirror": _mirror, "KafkaGateway": _kafka_gateway}
