"""Coverage-guided fuzzing of the codec and the protocol state machines, in process.

Not collected by pytest (no ``test_`` prefix): a longer, optional run.

    pip install atheris
    python tests/faults/fuzz_atheris.py -max_total_time=600            # 10 minutes
    python tests/faults/fuzz_atheris.py -max_total_time=600 corpus/    # keep a corpus
    DAFKA_FUZZ_KNOWN_BUGS=1 python tests/faults/fuzz_atheris.py ...     # once the known bugs are fixed

(any libFuzzer flag works: ``-runs=N``, ``-jobs=2``, ``-dict=...``; a crash is
written to ``crash-<sha1>`` and can be replayed with
``python tests/faults/fuzz_atheris.py crash-<sha1>``.)

Each input is split by a ``FuzzedDataProvider`` into one of these targets:

0. ``dafka.protocol.decoding.decode`` on 1-4 frames: returns a message or raises
   ``MalformedMessage``, nothing else, and a decoded message re-encodes to the
   same frames.
1. ``dafka.protocol.subscriptions.decode_subscription`` (same contract, re-encodes exactly),
   ``decode_beacon`` and ``decode_tower_beacon``.
2. The consumer state machine (``ConsumerState``) fed a sequence of frames,
   subscriptions and clock ticks: it never raises, and it hands each
   partition's records to the user in strictly increasing offsets, each once.
3. The store writer state machine (``WriterState``): it never raises, every
   key of every batch decodes with ``store/keys.py``, each partition's records
   are staged contiguously after its head, and only written heads are ACKed.
4. The producer state machine (``ProducerState``) with records it published:
   it never raises, and every FETCH answer carries exactly the content that was
   published under that sequence (the reference's known bug), never a
   sequence it released or never sent.

Inputs of the known product bugs (see the strict-xfail tests in
``test_fuzz.py``) are skipped unless ``DAFKA_FUZZ_KNOWN_BUGS=1``: a NUL in an
address field, which makes ``ConsumerState`` / ``ProducerState`` raise
``ValueError`` while encoding their answer.
"""

from __future__ import annotations

import logging
import os
import sys

import atheris

logging.disable(logging.CRITICAL)  # the state machines log what they drop; keep the fuzzer's output readable

with atheris.instrument_imports():
    from dafka import protocol as proto
    from dafka.consumer.state import ConsumerState
    from dafka.producer.state import ProducerState
    from dafka.store import keys
    from dafka.store.writer_state import WriterState

KNOWN_BUGS = os.environ.get("DAFKA_FUZZ_KNOWN_BUGS", "1") == "1"

ME = "C0FFEE00C0FFEE00C0FFEE00C0FFEE00"
WRITER = "5E1F0000000000000000000000000001"
PRODUCER = "AB12CD34EF56AB12CD34EF56AB12CD34"
TOPIC = "weather"
IDS = [b"M", b"D", b"F", b"K", b"H", b"E", b"G", b"W", b"L", b"T"]


def _content(seq: int) -> bytes:
    return b"content-%d" % seq


def _frames(fdp: atheris.FuzzedDataProvider) -> list[bytes]:
    return [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300)) for _ in range(fdp.ConsumeIntInRange(1, 4))]


def _message(fdp: atheris.FuzzedDataProvider, topics: list[str], addresses: list[str]) -> list[bytes]:
    """Mostly well-formed messages (so the state machines get past the
    decoder), sometimes raw bytes."""
    if fdp.ConsumeIntInRange(0, 9) == 0:
        return _frames(fdp)
    kind = fdp.ConsumeIntInRange(0, 9)

    def pick(options: list[str]) -> str:
        if fdp.ConsumeIntInRange(0, 7) == 0:
            return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)).decode("utf-8", "surrogateescape")
        return options[fdp.ConsumeIntInRange(0, len(options) - 1)]

    def seq() -> int:
        choice = fdp.ConsumeIntInRange(0, 5)
        if choice == 0:
            return proto.MAX_SEQUENCE
        if choice == 1:
            return fdp.ConsumeIntInRange(0, proto.MAX_SEQUENCE)
        return fdp.ConsumeIntInRange(0, 40)

    topic, address = pick(topics), pick(addresses)
    try:
        if kind == 0:
            msg = proto.RecordMsg(topic, address, topic, seq(), fdp.ConsumeBytes(8))
        elif kind == 1:
            msg = proto.DirectRecordMsg(pick([ME, WRITER]), address, topic, seq(), fdp.ConsumeBytes(8))
        elif kind == 2:
            msg = proto.HeadMsg(topic, address, topic, seq())
        elif kind == 3:
            msg = proto.DirectHeadMsg(ME, address, topic, seq())
        elif kind == 4:
            msg = proto.DirectTailMsg(pick([ME, WRITER]), address, topic, seq())
        elif kind == 5:
            msg = proto.StoreHelloMsg(ME, pick(addresses))
        elif kind == 6:
            msg = proto.FetchMsg(PRODUCER, pick(addresses), topic, seq(), fdp.ConsumeIntInRange(0, proto.MAX_COUNT))
        elif kind == 7:
            msg = proto.AckMsg(PRODUCER, topic, seq())
        elif kind == 8:
            msg = proto.ConsumerHelloMsg(pick(addresses), ME, (topic,))
        else:
            msg = proto.GetHeadsMsg(topic, address)
        return proto.encode(msg)
    except ValueError:
        return _frames(fdp)


def _known_bug(frames: list[bytes]) -> bool:
    if KNOWN_BUGS:
        return False
    try:
        msg = proto.decode(frames)
    except proto.MalformedMessage:
        return False
    return "\0" in getattr(msg, "address", "")


# -- targets -------------------------------------------------------------------


def fuzz_decode(fdp: atheris.FuzzedDataProvider) -> None:
    frames = _frames(fdp)
    try:
        msg = proto.decode(frames)
    except proto.MalformedMessage:
        return
    assert proto.encode(msg) == frames, (frames, msg)


def fuzz_small_decoders(fdp: atheris.FuzzedDataProvider) -> None:
    frame = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    try:
        sub = proto.decode_subscription(frame)
    except proto.MalformedMessage:
        pass
    else:
        if len(frame) > 1:
            assert proto.encode_subscription(sub) == frame, (frame, sub)
    frames = _frames(fdp)
    for decoder in (proto.decode_beacon, proto.decode_tower_beacon):
        try:
            decoder(frames)
        except proto.MalformedMessage:
            pass


def fuzz_consumer(fdp: atheris.FuzzedDataProvider) -> None:
    state = ConsumerState(ME, reset="earliest" if fdp.ConsumeBool() else "latest",
                          fetch_retry=0.3, max_buffered=fdp.ConsumeIntInRange(0, 8))
    topics = [TOPIC, "other"]
    addresses = [PRODUCER, "F" * 32, WRITER]
    state.subscribe(TOPIC)
    delivered: dict[tuple[str, str], int] = {}
    now = 0.0
    for _ in range(fdp.ConsumeIntInRange(1, 60)):
        op = fdp.ConsumeIntInRange(0, 9)
        if op <= 5:
            frames = _message(fdp, topics, addresses)
            if _known_bug(frames):
                continue
            if len(frames) == 2 and op <= 2:
                state.on_record_frames(frames[0], frames[1])
            else:
                state.on_frames(frames)
        elif op <= 7:
            state.on_subscription(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)))
        else:
            now += fdp.ConsumeIntInRange(0, 1000) / 1000.0
            state.tick(now)
        while state.ready:
            record = state.ready.popleft()
            key = (record.topic, record.partition)
            assert record.offset > delivered.get(key, -1), (key, record.offset, delivered.get(key))
            delivered[key] = record.offset
        for frames in state.out:
            proto.decode(frames)  # everything it sends is well-formed
        state.out.clear()


def fuzz_writer(fdp: atheris.FuzzedDataProvider) -> None:
    state = WriterState(WRITER, fetch_retry=0.3, max_buffered=fdp.ConsumeIntInRange(0, 8),
                        fetch_chunk=fdp.ConsumeIntInRange(1, 50))
    topics = [TOPIC, "other"]
    addresses = [PRODUCER, "F" * 32]
    now = 0.0
    for _ in range(fdp.ConsumeIntInRange(1, 60)):
        op = fdp.ConsumeIntInRange(0, 9)
        if op <= 6:
            frames = _message(fdp, topics, addresses)
            if len(frames) == 2 and op <= 2:
                state.on_record_frames(frames[0], frames[1])
            else:
                state.on_frames(frames)
        elif op == 7:
            now += fdp.ConsumeIntInRange(0, 1000) / 1000.0
            state.tick(now)
        else:
            written_before = {k: p.written for k, p in state.partitions.items()}
            batch = state.take_batch(1_700_000_000_000 + int(now * 1000))
            if batch is None:
                continue
            seqs: dict[tuple[str, str], list[int]] = {}
            for key in batch.keys:
                parsed = keys.parse_key(key)  # raises ValueError on a key outside the layout
                if parsed.tag == keys.RECORD:
                    seqs.setdefault((parsed.subject, parsed.address), []).append(parsed.seq)
            for part, got in seqs.items():
                assert got == sorted(got) and len(set(got)) == len(got), (part, got)
                assert got[-1] == state.partitions[part].head, (part, got)
            if fdp.ConsumeBool():
                state.batch_written(batch)
                for p, head in batch.acks:
                    assert p.written >= head
            else:
                state.batch_failed(batch)
                assert all(state.partitions[k].written == w for k, w in written_before.items())
        for frames in state.out:
            msg = proto.decode(frames)
            if isinstance(msg, proto.AckMsg):
                p = state.partitions[(msg.subject, msg.topic)]
                assert msg.sequence <= p.written, (msg, p)
        state.out.clear()


def fuzz_producer(fdp: atheris.FuzzedDataProvider) -> None:
    state = ProducerState(PRODUCER, TOPIC, min_acks=fdp.ConsumeIntInRange(0, 2),
                          max_unacked=fdp.ConsumeIntInRange(1, 50))
    addresses = [ME, WRITER, "F" * 32]
    for _ in range(fdp.ConsumeIntInRange(1, 60)):
        op = fdp.ConsumeIntInRange(0, 5)
        if op <= 1 and state.has_room(8):
            seq = state.next_seq
            assert state.publish(_content(seq)) == seq
            assert proto.decode([state.record_frame(seq), _content(seq)]).sequence == seq
        elif op <= 1:
            assert state.publish(_content(state.next_seq)) == -1
        elif op == 2:
            frames = _message(fdp, [TOPIC], addresses)
            try:
                msg = proto.decode(frames)
            except proto.MalformedMessage:
                continue
            if isinstance(msg, proto.AckMsg):
                state.on_ack(addresses[fdp.ConsumeIntInRange(0, 2)], msg)
            elif isinstance(msg, proto.FetchMsg) and (KNOWN_BUGS or "\0" not in msg.address):
                state.on_fetch(msg)
        elif op == 3:
            seq = fdp.ConsumeIntInRange(0, state.next_seq + 3)
            requester = addresses[fdp.ConsumeIntInRange(0, 2)]
            state.on_fetch(proto.FetchMsg(PRODUCER, requester, TOPIC, seq, fdp.ConsumeIntInRange(0, 100)))
        elif op == 4:
            state.forget_store(addresses[fdp.ConsumeIntInRange(0, 2)])
        else:
            for frame, content in state.fetch_answers(fdp.ConsumeIntInRange(1, 20)):
                msg = proto.decode([frame, content])
                assert msg.sequence < state.next_seq, msg
                assert content == _content(msg.sequence), (msg.sequence, content)
        assert state.released <= state.next_seq - 1
        assert len(state.buffer) == state.next_seq - state.base or state.min_acks == 0


TARGETS = [fuzz_decode, fuzz_small_decoders, fuzz_consumer, fuzz_writer, fuzz_producer]


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    TARGETS[fdp.ConsumeIntInRange(0, len(TARGETS) - 1)](fdp)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
