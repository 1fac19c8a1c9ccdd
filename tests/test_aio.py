"""dafka.aio: the asyncio producer and consumer over real sockets, run with
plain ``asyncio.run`` (no plugin): the sync API's guarantees and errors, many
producers in one event loop, cancellation at every await, a slow consumer
under back pressure, offsets files, serializers, close bounds and CURVE."""

from __future__ import annotations

import asyncio
import threading
import time

import msgpack
import pytest

from dafka import BufferFull, Closed, FlushTimeout, Producer, RecordMetadata, RecordTooLarge, protocol as proto
from dafka.protocol import bulk
from dafka.consumer import consumer as consumer_module
from dafka.aio import AsyncConsumer, AsyncProducer, SendFuture, TopicPartition
from dafka.consumer.state import ConsumerState
from dafka.store import Store
from helpers import loopback_config, secure_config
from rawpeer import RawPeer

STORE = "A" * 32


def run(coro, timeout: float = 60):
    """Run ``coro`` in a new event loop; a hang fails the test instead of blocking the suite."""
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def earliest(tower, **overrides):
    return loopback_config(tower, consumer__offset__reset="earliest", **overrides)


async def read(consumer: AsyncConsumer, count: int, timeout: float = 10) -> list:
    """Exactly ``count`` records through getmany, failing after ``timeout`` seconds."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"read {len(got)} of {count} records"
        for batch in (await consumer.getmany(timeout_ms=200, max_records=count - len(got))).values():
            got.extend(batch)
    return got


async def wait_until(predicate, timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
def store(tower, tmp_path):
    s = Store(loopback_config(tower), db=str(tmp_path / "db")).start()
    yield s
    s.stop()


# -- the API and its guarantees ------------------------------------------------


def test_send_getone_getmany_and_async_for_deliver_in_order_once(tower):
    config = earliest(tower, producer__min_acks=0)

    async def main():
        async with AsyncProducer("weather", config) as producer, \
                AsyncConsumer("weather", config=config) as consumer:
            metadata = await producer.send_and_wait(b"sunny")
            assert metadata == RecordMetadata("weather", producer.address, 0)
            future = await producer.send(b"rain")
            assert isinstance(future, SendFuture) and (await future).offset == 1 and future.done()
            assert future.result() == RecordMetadata("weather", producer.address, 1)
            await producer.flush()
            first = await consumer.getone()
            assert (first.offset, first.value) == (0, b"sunny")
            for i in range(2, 300):
                await producer.send(b"%d" % i)
            batches = await consumer.getmany(timeout_ms=5000, max_records=5)
            key = TopicPartition("weather", producer.address)
            assert list(batches) == [key] and key == ("weather", producer.address)
            batch = [r.offset for r in batches[key]]
            assert batch == list(range(1, 1 + len(batch))) and len(batch) <= 5  # what was ready, at most 5
            offsets = []
            async for record in consumer:
                offsets.append(record.offset)
                if record.offset == 299:
                    break
            assert offsets == list(range(batch[-1] + 1, 300))
            assert await consumer.getmany(timeout_ms=100) == {}
            assert consumer.positions() == {("weather", producer.address): 300}
            consumer.seek(producer.address, 297)
            assert [r.offset for r in await read(consumer, 3)] == [297, 298, 299]

    run(main())


def test_many_producers_in_one_event_loop(tower, store):
    """Twelve producers, each acked by a store, send concurrently from one
    loop; one consumer gets every partition in order, each record once."""
    config = earliest(tower)
    producers_count, records = 12, 250

    async def produce(producer: AsyncProducer) -> list[RecordMetadata]:
        futures = [await producer.send(b"%d" % i) for i in range(records - 1)]
        last = await producer.send_and_wait(b"%d" % (records - 1))
        return [*await asyncio.gather(*futures), last]

    async def main():
        producers = [AsyncProducer("many", config) for _ in range(producers_count)]
        try:
            async with AsyncConsumer("many", config=config) as consumer:
                sent = await asyncio.gather(*(produce(p) for p in producers))
                for producer, metadata in zip(producers, sent):
                    assert [m.offset for m in metadata] == list(range(records))
                    assert {m.partition for m in metadata} == {producer.address}
                got = await read(consumer, producers_count * records, timeout=30)
                by_partition: dict[str, list[int]] = {}
                for r in got:
                    by_partition.setdefault(r.partition, []).append(r.offset)
                    assert r.value == b"%d" % r.offset
                assert by_partition == {p.address: list(range(records)) for p in producers}
                assert await consumer.getmany(timeout_ms=300) == {}
        finally:
            for producer in producers:
                await producer.stop()

    run(main())


def test_catch_up_from_a_store_goes_through_the_sync_intake_in_bulk(tower, store, monkeypatch):
    """The async consumer reads through the sync consumer's intake, so the
    store's bulk answers (DIRECT-RECORDS) reach it as they reach consume()."""
    bulk_answers = []
    on_records = ConsumerState._on_records
    monkeypatch.setattr(ConsumerState, "_on_records",
                        lambda state, p, msg: (bulk_answers.append(msg.count), on_records(state, p, msg)))
    config = earliest(tower)
    total = 5000

    async def main():
        async with AsyncProducer("stored", config) as producer:
            for i in range(total):
                await producer.send(b"%d" % i)
            await producer.flush(timeout=10)
        async with AsyncConsumer("stored", config=config) as consumer:
            offsets = []
            async for record in consumer:
                assert record.value == b"%d" % record.offset
                offsets.append(record.offset)
                if len(offsets) == total:
                    break
            assert offsets == list(range(total))
            assert await consumer.getmany(timeout_ms=300) == {}
        assert sum(bulk_answers) >= total // 2  # most came in bulk

    run(main())


def test_serializers(tower):
    config = earliest(tower, producer__min_acks=0)

    async def main():
        async with AsyncProducer("ser", config, value_serializer=msgpack.packb) as producer, \
                AsyncConsumer("ser", config=config, value_deserializer=msgpack.unpackb) as consumer:
            for i in range(10):
                await producer.send({"n": i})
            assert (await consumer.getone()).value == {"n": 0}
            assert [r.value["n"] for r in await read(consumer, 4)] == [1, 2, 3, 4]
            values = []
            async for record in consumer:
                values.append(record.value)
                if len(values) + 5 == 10:
                    break
            assert values == [{"n": i} for i in range(5, 10)]

    run(main())


def test_offsets_file_resumes_without_loss_or_repeat(tower, tmp_path):
    """What a read returned counts as consumed when the next read starts or
    at close, whichever API read it (getone, async for, getmany)."""
    path = str(tmp_path / "w.offsets")
    config = earliest(tower, producer__min_acks=0)

    async def main():
        async with AsyncProducer("resume", config) as producer:
            for i in range(100):
                await producer.send(b"%d" % i)
            async with AsyncConsumer("resume", config=config, offsets_path=path) as first:
                assert [(await first.getone()).offset for _ in range(30)] == list(range(30))
            async with AsyncConsumer("resume", config=config, offsets_path=path) as second:
                async for record in second:
                    if record.offset == 59:
                        break
            async with AsyncConsumer("resume", config=config, offsets_path=path) as third:
                assert [r.offset for r in await read(third, 40)] == list(range(60, 100))
                assert await third.getmany(timeout_ms=300) == {}
            async with AsyncConsumer("resume", config=config, offsets_path=path) as fourth:
                assert await fourth.getmany(timeout_ms=300) == {}
                assert fourth.positions() == {("resume", producer.address): 100}

    run(main())


# -- errors ------------------------------------------------------------------------


def test_same_errors_as_the_sync_api(tower):
    config = earliest(tower, producer__min_acks=0, producer__max_record_bytes=100)

    async def main():
        producer = AsyncProducer("err", config)
        consumer = AsyncConsumer("err", config=config)
        await producer.send(b"x" * 100)
        with pytest.raises(RecordTooLarge, match="101 bytes"):
            await producer.send(b"x" * 101)
        assert producer.stats()["sent"] == 1
        with pytest.raises(TypeError, match="bytes"):
            await producer.send("text")
        with pytest.raises(ValueError):
            await consumer.getmany(max_records=0)
        await producer.stop()
        await consumer.stop()
        await producer.flush()  # nothing left to ack: as the sync flush, no error
        with pytest.raises(Closed):
            await producer.send(b"x")
        with pytest.raises(Closed):
            await consumer.getone()
        with pytest.raises(Closed):
            await consumer.getmany()
        assert [r async for r in consumer] == []
        await producer.stop()  # idempotent
        await consumer.stop()

    run(main())


def test_full_buffer_is_awaited_then_buffer_full_and_nothing_dropped(tower):
    """Waiting for room never blocks the event loop: another task runs meanwhile."""
    config = loopback_config(tower, producer__max_unacked=10, producer__send_timeout=300,
                             producer__terminate_unacked=1)

    async def main():
        async with AsyncProducer("bp", config) as producer:
            for _ in range(10):
                await producer.send(b"x")
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.create_task(ticker())
            started = time.monotonic()
            with pytest.raises(BufferFull, match="waited 0.3s.*max_unacked=10"):
                await producer.send(b"y")
            assert 0.25 < time.monotonic() - started < 3
            task.cancel()
            assert ticks >= 2  # the loop kept running while send waited (a loaded machine gives it few turns)
            assert producer.stats()["sent"] == 10 and producer.stats()["buffered"] == 10

    run(main())


def test_back_pressure_releases_in_order_when_a_store_acks(tower):
    fake = RawPeer(tower, STORE, [])
    config = loopback_config(tower, producer__max_unacked=2)

    async def main():
        async with AsyncProducer("bp2", config) as producer:
            futures = [await producer.send(b"0"), await producer.send(b"1")]
            waiting = [asyncio.create_task(producer.send(b"%d" % i)) for i in (2, 3, 4)]
            await asyncio.sleep(0.1)
            assert not any(t.done() for t in waiting) and producer.stats()["sent"] == 2
            fake.wait_subscribed(b"K" + producer.address.encode())
            fake.send(proto.AckMsg(producer.address, "bp2", 0))
            assert (await asyncio.wait_for(futures[0], 5)).offset == 0
            await wait_until(lambda: waiting[0].done(), what="the first waiting send")
            assert not futures[1].done() and not waiting[1].done()
            fake.send(proto.AckMsg(producer.address, "bp2", 2))
            more = [await asyncio.wait_for(t, 5) for t in waiting]  # the waiting sends, in order
            assert [(await f).offset for f in [*futures, more[0]]] == [0, 1, 2]
            assert not more[1].done() and not more[2].done()
            fake.send(proto.AckMsg(producer.address, "bp2", 4))
            await producer.flush(timeout=5)
            assert [f.result().offset for f in more] == [2, 3, 4]

    try:
        run(main())
    finally:
        fake.close()


def test_send_many_publishes_a_burst_at_once_and_waits_for_room_without_blocking_the_loop(tower):
    fake = RawPeer(tower, STORE, [])
    config = loopback_config(tower, producer__max_unacked=4)

    async def main():
        async with AsyncProducer("many", config) as producer:
            assert await producer.send_many([b"a", b"b", b"c"], keys=[b"k", None, b"k"]) == 0
            waiting = asyncio.create_task(producer.send_many([b"d", b"e"]))  # 3 + 2 > 4: waits for acks
            ticks = 0
            while ticks < 5:  # the loop runs meanwhile
                await asyncio.sleep(0.02)
                ticks += 1
            assert not waiting.done() and producer.stats()["sent"] == 3
            fake.wait_subscribed(b"K" + producer.address.encode())
            fake.send(proto.AckMsg(producer.address, "many", 1))
            assert await asyncio.wait_for(waiting, 5) == 3
            burst = asyncio.create_task(producer.send_many([b"%d" % i for i in range(10)]))  # > the buffer
            acked = 4
            while not burst.done():  # it goes record by record, as the acks make room
                await asyncio.sleep(0.02)
                if producer.next_offset - 1 > acked:
                    acked = producer.next_offset - 1
                    fake.send(proto.AckMsg(producer.address, "many", acked))
            assert burst.result() == 5
            fake.send(proto.AckMsg(producer.address, "many", 14))
            await producer.flush(timeout=5)
            assert producer.next_offset == 15

    try:
        run(main())
    finally:
        fake.close()


def test_send_futures_work_awaited_or_not_in_any_order_and_with_asyncio_functions(tower):
    """The asyncio Future behind a SendFuture is made only when needed; every
    way of looking at it agrees, whatever the order."""
    fake = RawPeer(tower, STORE, [])
    config = loopback_config(tower)

    async def main():
        async with AsyncProducer("lazy", config) as producer:
            futures = [await producer.send(b"%d" % i) for i in range(6)]
            assert [f.offset for f in futures] == list(range(6))
            assert not any(f.done() for f in futures)
            with pytest.raises(asyncio.InvalidStateError):
                futures[0].result()
            called = []
            futures[1].add_done_callback(lambda f: called.append(f.result().offset))
            waiter = asyncio.ensure_future(futures[3])  # awaited before an older one
            assert futures[5].cancel() and futures[5].cancelled()  # stops the waiting only
            fake.wait_subscribed(b"K" + producer.address.encode())
            fake.send(proto.AckMsg(producer.address, "lazy", 3))
            assert (await asyncio.wait_for(waiter, 5)).offset == 3
            assert (await futures[2]).offset == 2  # done before anyone asked
            assert [m.offset for m in await asyncio.gather(*futures[:4])] == [0, 1, 2, 3]
            assert called == [1] and futures[0].exception() is None
            assert futures[0].result() == RecordMetadata("lazy", producer.address, 0)
            done, pending = await asyncio.wait([futures[4]], timeout=0.1)
            assert not done and not futures[4].done()
            shielded = asyncio.shield(futures[4])
            fake.send(proto.AckMsg(producer.address, "lazy", 5))
            assert (await asyncio.wait_for(shielded, 5)).offset == 4
            await producer.flush(timeout=5)
            with pytest.raises(asyncio.CancelledError):
                futures[5].result()
            assert producer.stats()["acked"] == 6  # the cancelled future's record was sent and acked

    try:
        run(main())
    finally:
        fake.close()


def test_flush_and_close_time_out_with_a_count_and_fail_the_futures(tower):
    config = loopback_config(tower, producer__close_timeout=200)

    async def main():
        producer = AsyncProducer("unacked", config)
        futures = [await producer.send(b"x") for _ in range(7)]
        with pytest.raises(FlushTimeout, match="7 record") as err:
            await producer.flush(timeout=0.2)
        assert err.value.unacked == 7
        started = time.monotonic()
        with pytest.raises(FlushTimeout, match="7 record") as err:
            await producer.stop()
        assert err.value.unacked == 7
        assert 0.15 < time.monotonic() - started < 3  # producer/close_timeout, as the sync close
        for future in futures:
            with pytest.raises(Closed):
                future.result()
        with pytest.raises(Closed):
            await producer.send(b"x")

    run(main())


def test_terminate_unacked_stops_at_once(tower):
    config = loopback_config(tower, producer__terminate_unacked=1)

    async def main():
        producer = AsyncProducer("unacked", config)
        future = await producer.send(b"x")
        started = time.monotonic()
        await producer.stop()
        assert time.monotonic() - started < 1
        assert isinstance(future.exception(), Closed)

    run(main())


def test_closing_the_consumer_ends_waiting_reads(tower):
    config = earliest(tower)

    async def main():
        consumer = AsyncConsumer("quiet", config=config)
        iterated = []

        async def iterate():
            async for record in consumer:
                iterated.append(record)

        getone = asyncio.create_task(consumer.getone())
        loop_task = asyncio.create_task(iterate())
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await consumer.stop()
        with pytest.raises(Closed):
            await getone
        await asyncio.wait_for(loop_task, 2)  # async for ended
        assert iterated == [] and time.monotonic() - started < 2

    run(main())


# -- cancellation --------------------------------------------------------------


def test_cancelled_reads_lose_nothing(tower):
    """Reads cancelled at random points while records flow: every record still
    arrives once, in order, and the consumer stays usable."""
    config = earliest(tower, producer__min_acks=0)
    total = 3000

    async def main():
        async with AsyncProducer("cancel", config) as producer, \
                AsyncConsumer("cancel", config=config) as consumer:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(consumer.getone(), 0.05)  # cancelled with nothing to read

            async def produce():  # in bursts, so that reads often wait
                for i in range(total):
                    await producer.send(b"%d" % i)
                    if i % 7 == 0:
                        await asyncio.sleep(0.002)

            sender = asyncio.create_task(produce())
            got: list[int] = []
            cancelled = 0
            deadline = time.monotonic() + 30
            reads = [lambda: consumer.getone(), lambda: consumer.getmany(timeout_ms=50, max_records=7),
                     lambda: consumer.__anext__()]
            n = 0
            while len(got) < total and time.monotonic() < deadline:
                n += 1
                task = asyncio.create_task(reads[n % 3]())
                delay = n % 4  # 0: cancelled before it starts; else at whatever await it reached
                if delay:
                    await asyncio.sleep((delay - 1) * 0.001)
                task.cancel()
                try:
                    result = await task
                except asyncio.CancelledError:
                    cancelled += 1
                    continue
                if isinstance(result, dict):
                    got.extend(r.offset for batch in result.values() for r in batch)
                else:
                    got.append(result.offset)
            await sender
            assert cancelled > total // 10
            assert got == list(range(total))
            assert await consumer.getmany(timeout_ms=200) == {}

    run(main(), timeout=90)


def test_cancelled_sends_flushes_and_closes_leave_the_producer_usable(tower):
    fake = RawPeer(tower, STORE, [])
    config = loopback_config(tower, producer__max_unacked=3)

    async def main():
        producer = AsyncProducer("cancel", config)
        with pytest.raises(TimeoutError):  # cancelled while it waits for the ack: the record stays sent
            await asyncio.wait_for(producer.send_and_wait(b"0"), 0.1)
        await producer.send(b"1")
        await producer.send(b"2")
        with pytest.raises(TimeoutError):  # cancelled while it waits for room: nothing sent
            await asyncio.wait_for(producer.send(b"never"), 0.1)
        assert producer.stats()["sent"] == 3
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(producer.flush(), 0.1)
        with pytest.raises(TimeoutError):  # stop cancelled while it flushes: still open
            await asyncio.wait_for(producer.stop(), 0.1)
        waiting = asyncio.create_task(producer.send(b"3"))
        fake.wait_subscribed(b"K" + producer.address.encode())
        fake.send(proto.AckMsg(producer.address, "cancel", 2))
        future = await asyncio.wait_for(waiting, 5)
        fake.send(proto.AckMsg(producer.address, "cancel", 3))
        await producer.flush(timeout=5)
        assert future.result().offset == 3 and producer.stats()["acked"] == 4
        await producer.stop()

    try:
        run(main())
    finally:
        fake.close()


# -- a slow consumer, a producer under back pressure ---------------------------------


def test_slow_consumer_with_back_pressure_loses_nothing_and_stays_bounded(tower, store):
    """A producer limited to 50 unacked records waits for the store's acks; a
    consumer with a small socket queue reads slowly, so records overflow it
    and come back by FETCH.  Every record arrives once, in order, and the
    records queued in the consumer stay bounded: they leave the sockets only
    when the queue is empty, and then at most dafka.consumer.consumer.DRAIN records
    and one more step of DRAIN_STEP messages (here DIRECT-RECORDS of up to
    256 KiB), far less than the producer sent ahead.  (Bounded by what the
    sockets held instead, it reached 7,000-14,400 on a quiet machine.)"""
    total = 20_000
    config = earliest(tower, producer__max_unacked=50, consumer__high_watermark=20,
                      consumer__max_buffered=1000, consumer__fetch_max_bytes=100_000)
    pad = b"x" * 992

    async def main():
        async with AsyncProducer("slow", config) as producer, \
                AsyncConsumer("slow", config=config) as consumer:
            peak_unacked = 0

            async def produce():
                nonlocal peak_unacked
                for i in range(total):
                    await producer.send(b"%08d" % i + pad)
                    peak_unacked = max(peak_unacked, producer.stats()["unacked"])
                await producer.flush(timeout=30)

            sender = asyncio.create_task(produce())
            got: list[int] = []
            peak_ready = 0
            deadline = time.monotonic() + 60
            while len(got) < total and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=500, max_records=200)).values():
                    got.extend(r.offset for r in batch)
                    assert all(r.value == b"%08d" % r.offset + pad for r in batch)
                peak_ready = max(peak_ready, consumer.stats()["ready"])
                await asyncio.sleep(0.01)  # the slow part
            await sender
            assert got == list(range(total))
            assert peak_unacked == 50  # send waited for room
            bound = consumer_module.DRAIN + consumer_module.DRAIN_STEP * (bulk.MAX_BYTES // len(pad))
            assert peak_ready <= bound < total // 3, peak_ready
            assert producer.stats()["acked"] == total

    run(main(), timeout=120)


# -- no busy polling ---------------------------------------------------------------


def test_waiting_reads_and_sends_do_not_spin(tower):
    """A read that waits a second and a send waiting for room cost the event
    loop's thread almost no CPU: they sleep on file descriptors and timers."""
    config = loopback_config(tower, producer__max_unacked=1, producer__send_timeout=1000,
                             producer__terminate_unacked=1)

    async def main():
        async with AsyncConsumer("idle", config=config) as consumer, AsyncProducer("idle2", config) as producer:
            await producer.send(b"x")
            cpu = time.thread_time()
            started = time.monotonic()
            results = await asyncio.gather(consumer.getmany(timeout_ms=1000), producer.send(b"y"),
                                           return_exceptions=True)
            assert results[0] == {} and isinstance(results[1], BufferFull)
            assert time.monotonic() - started >= 0.95
            assert time.thread_time() - cpu < 0.2

    run(main())


def test_a_consumer_nobody_reads_costs_nothing_while_records_pour_in_and_loses_none(tower):
    """Between reads the sockets' FDs may signal, but nothing drains them:
    ZeroMQ queues (and drops past its high-water mark, recovered by FETCH)."""
    config = earliest(tower, producer__min_acks=0)
    total = 20_000

    async def main():
        async with AsyncConsumer("pour", config=config) as consumer:
            with Producer("pour", config) as producer:
                await consumer.getmany(timeout_ms=300)  # connected, nothing yet
                sender = threading.Thread(target=lambda: [producer.send(b"%d" % i) for i in range(total)],
                                          name="test-sender")
                cpu = time.thread_time()
                sender.start()
                await asyncio.sleep(1)  # nobody reads
                assert time.thread_time() - cpu < 0.2
                sender.join(10)
                got = [r.offset for r in await read(consumer, total, timeout=30)]
                assert got == list(range(total))

    run(main())


# -- security ----------------------------------------------------------------------


def test_curve_authorized_peers_exchange_records(secure_tower, keys):
    async def main():
        async with AsyncProducer("sec", secure_config(secure_tower, keys, "alice", **{"producer/min_acks": 0})) as p, \
                AsyncConsumer("sec", config=secure_config(secure_tower, keys, "bob",
                                                       **{"consumer/offset/reset": "earliest"})) as consumer, \
                AsyncConsumer("sec", config=secure_config(secure_tower, keys, "mallory",
                                                       **{"consumer/offset/reset": "earliest"})) as intruder:
            for i in range(10):
                await p.send(b"%d" % i)
            assert [r.offset for r in await read(consumer, 10)] == list(range(10))
            assert await intruder.getmany(timeout_ms=1000) == {}
            assert consumer.connected and p.connected and not intruder.connected

    run(main())


def test_a_consumer_is_bound_to_one_event_loop(tower):
    consumer = AsyncConsumer("bound", config=earliest(tower))
    try:
        asyncio.run(consumer.getmany())
        with pytest.raises(RuntimeError, match="another event loop"):
            asyncio.run(consumer.getmany())
    finally:
        asyncio.run(consumer.stop())

