"""A consumer that falls behind: stopped (SIGSTOP) while its producer sends,
so that its queues overflow and the senders drop what follows (PUB
semantics), then resumed.

Without a store, the producers here send a HEAD only once a minute, and the
stream ends while the consumer is stopped: nothing that arrives later shows
the consumer what it missed, only its own probe after the full queue (rfc
8.5, "Full queue").  With a store, the producer sends its HEAD every second
(the default): the store writer, whose queue may drop the end of the stream
too, learns the head from it.
The queues are a few messages long (``consumer/receive_bytes``,
``producer/send_bytes``) so that they overflow with a few thousand records."""

from __future__ import annotations

import signal
import time

import pytest

from faultcheck import check

pytestmark = pytest.mark.faults

TOPIC = "behind"
SMALL_QUEUES = {"consumer__receive_bytes": 1 << 20, "producer__send_bytes": 1 << 20,
                "producer__head_interval": 60_000}


def stop_mid_stream(cluster, producer, consumer, pause: float, until_sent: int = 0) -> int:
    """SIGSTOP ``consumer`` once it has read some of the stream, for ``pause``
    seconds and until the producer's counters show ``until_sent`` records sent
    (a loaded machine sends 10,000/s late, and a role's counters on disk lag
    by a snapshot); returns how many records the producer had sent by then."""
    consumer.wait_stat(lambda s: s.get("delivered", 0) >= 200, 20, "the consumer reads the live stream")
    consumer.send_signal(signal.SIGSTOP)
    try:
        time.sleep(pause)
        if until_sent:
            producer.wait_stat(lambda s: s.get("sent", 0) >= until_sent, 30, f"{until_sent} records sent")
        sent = producer.stats().get("sent", 0)
    finally:
        consumer.send_signal(signal.SIGCONT)
    return sent


@pytest.mark.parametrize("size", [100, 1000])
@pytest.mark.parametrize("with_store", [False, True], ids=["no store", "store"])
def test_a_stopped_consumer_recovers_every_record(cluster, fault_report, size, with_store):
    n = 20_000
    queues = dict(SMALL_QUEUES, producer__head_interval=1000) if with_store else SMALL_QUEUES
    stores = [cluster.store("s1", **queues)] if with_store else []
    cluster.consumer("steady", TOPIC, **queues)
    behind = cluster.consumer("behind", TOPIC, **queues)
    producer = cluster.producer("p1", TOPIC, count=n, rate=10_000, size=size, wait_peers=2 + 2 * len(stores),
                                hold=True, producer__min_acks=len(stores), producer__max_unacked=n + 1, **queues)
    sent_while_stopped = stop_mid_stream(cluster, producer, behind, 2.5, until_sent=n - 1)
    assert sent_while_stopped >= n - 1, "the stream was to end while the consumer was stopped"
    address = producer.producer_log().address
    expected = {(address, o) for o in range(n)}
    cluster.wait_delivered("steady", expected, 30)
    cluster.wait_delivered("behind", expected, 30)
    stats = behind.fresh_stats()
    assert stats["records_lost"] == 0 and stats["probes"] >= 1, stats
    assert producer.stop() == 0
    report = check(f"consumer stopped 2.5 s, {size} B, {'a store' if stores else 'no store'}",
                   [producer.producer_log()], cluster.consumer_runs(), value_size=size)
    fault_report(report)


def test_a_consumer_goes_on_past_what_nobody_holds_and_counts_it(cluster):
    """No store, and a ring of 5,000 records: what the consumer missed beyond
    that is gone.  It says so, counts it, and reads on from the oldest record
    the producer still holds, instead of asking for ever."""
    n, ring = 20_000, 5_000
    behind = cluster.consumer("behind", TOPIC, **SMALL_QUEUES)
    producer = cluster.producer("p1", TOPIC, count=n, rate=10_000, wait_peers=1, hold=True, producer__min_acks=0,
                                producer__max_unacked=ring, **SMALL_QUEUES)
    stop_mid_stream(cluster, producer, behind, 3.0)
    address = producer.producer_log().address
    cluster.wait_delivered("behind", {(address, o) for o in range(n - ring, n)}, 30)
    offsets = [o for _, o, _ in cluster.consumer_runs()["behind"][0].deliveries]
    assert offsets == sorted(set(offsets)), "delivered once each, in order"
    stats = behind.fresh_stats()
    assert stats["records_lost"] == n - len(offsets) > 0, stats
    assert offsets[-1] == n - 1
    assert producer.fresh_stats()["tails_sent"] >= 1
    assert "held by nobody any more" in behind.err.read_text()
    assert producer.stop() == 0
