"""The gateway's codec and mapping without sockets: messages, record batches, and requests onto dafka."""

from __future__ import annotations

import dataclasses
import importlib
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from test_extensions import outcome as call

from dafka.protocol import attributes
from dafka.protocol.encoding import pack_contents as encode_pack_contents, pack_keys as encode_pack_keys
from dafka.protocol.messages import DirectKeyedRecordsMsg
from dafka.kafka import batches, errors, records
from dafka.kafka.mapping import Answer, Appends, Mapping, Reads, TopicView, address_of
from dafka.kafka.messages import (
    API_VERSIONS, APIS, SASL_AUTHENTICATE, SASL_HANDSHAKE,
    CREATE_TOPICS, DELETE_GROUPS, DELETE_TOPICS, DESCRIBE_CONFIGS, DESCRIBE_GROUPS, FETCH, FIND_COORDINATOR,
    HEARTBEAT, INIT_PRODUCER_ID, JOIN_GROUP, LEAVE_GROUP, LIST_GROUPS, LIST_OFFSETS, METADATA, OFFSET_COMMIT,
    OFFSET_FETCH, PRODUCE, SYNC_GROUP, read_request, response_frame,
)
from dafka.kafka.wire import DecodeError, Reader, uvarint


def request_frame(api, version: int, body: dict, correlation: int = 1, client: str | None = "t",
                  header_tags: bytes = b"") -> bytes:
    """A request as a client writes it (header v1, or v2 with tagged fields from the API's flexible version)."""
    out: list[bytes] = [struct.pack(">hhi", api.key, version, correlation)]
    raw = None if client is None else client.encode()
    out.append(struct.pack(">h", -1) if raw is None else struct.pack(">h", len(raw)) + raw)
    if api.is_flexible(version):
        out.append(header_tags or uvarint(0))
    api.request.write_version(out, body, api.is_flexible(version), version)
    return b"".join(out)


def test_every_served_version_of_every_request_round_trips():
    bodies = {
        API_VERSIONS.key: {"client_software_name": "x", "client_software_version": "1"},
        METADATA.key: {"topics": [{"name": "t"}], "allow_auto_topic_creation": True},
        PRODUCE.key: {"transactional_id": None, "acks": -1, "timeout_ms": 500,
                      "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"abc"}]}]},
        FETCH.key: {"replica_id": -1, "max_wait_ms": 100, "min_bytes": 1, "max_bytes": 1000, "isolation_level": 0,
                    "session_id": 0, "session_epoch": -1, "rack_id": "",
                    "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 5,
                                                               "partition_max_bytes": 100}]}]},
        LIST_OFFSETS.key: {"replica_id": -1, "topics": [{"name": "t", "partitions": [{"partition_index": 0,
                                                                                      "timestamp": -2}]}]},
        FIND_COORDINATOR.key: {"key": "g", "key_type": 0},
        JOIN_GROUP.key: {"group_id": "g", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000, "member_id": "",
                         "group_instance_id": None, "protocol_type": "consumer",
                         "protocols": [{"name": "range", "metadata": b"m"}]},
        SYNC_GROUP.key: {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None,
                         "assignments": [{"member_id": "m", "assignment": b"a"}]},
        HEARTBEAT.key: {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None},
        LEAVE_GROUP.key: {"group_id": "g", "member_id": "m", "members": [{"member_id": "m", "group_instance_id": None}]},
        OFFSET_COMMIT.key: {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None,
                            "retention_time_ms": -1, "topics": [{"name": "t", "partitions": [{
                                "partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
                                "committed_metadata": None}]}]},
        OFFSET_FETCH.key: {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0]}], "require_stable": False},
        LIST_GROUPS.key: {},
        DESCRIBE_GROUPS.key: {"groups": ["g"], "include_authorized_operations": False},
        DELETE_GROUPS.key: {"groups_names": ["g"]},
        INIT_PRODUCER_ID.key: {"transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1,
                               "producer_epoch": -1},
        CREATE_TOPICS.key: {"topics": [{"name": "t", "num_partitions": 2, "replication_factor": -1, "assignments": [],
                                        "configs": []}], "timeout_ms": 1000, "validate_only": False},
        DELETE_TOPICS.key: {"topic_names": ["t"], "timeout_ms": 1000},
        DESCRIBE_CONFIGS.key: {"resources": [{"resource_type": 2, "resource_name": "t", "configuration_keys": None}],
                               "include_synonyms": False, "include_documentation": False},
        SASL_HANDSHAKE.key: {"mechanism": "SCRAM-SHA-512"},
        SASL_AUTHENTICATE.key: {"auth_bytes": b"n,,n=u,r=x"},
    }
    for api in APIS.values():
        for version in range(api.lo, api.hi + 1):
            request = read_request(request_frame(api, version, bodies[api.key], correlation=version))
            assert (request.api, request.version, request.correlation_id, request.client_id) == \
                (api, version, version, "t")
            assert request.body is not None
            if api is PRODUCE:
                assert bytes(request.body["topic_data"][0]["partition_data"][0]["records"]) == b"abc"
            if api is FETCH:
                assert request.body["topics"][0]["partitions"][0]["fetch_offset"] == 5


def test_unknown_tagged_fields_are_skipped_in_the_header_and_the_body():
    # Metadata v9 (flexible): a header with tag 7 of 3 bytes, a body whose topic struct carries tag 5.
    out = [struct.pack(">hhih", 3, 9, 42, 1), b"c", uvarint(1), uvarint(7), uvarint(3), b"xyz"]
    out += [uvarint(2), uvarint(len("t") + 1), b"t", uvarint(1), uvarint(5), uvarint(2), b"ab"]  # topics: [t]
    out += [b"\x01", b"\x00", b"\x00", uvarint(0)]  # auto create, authorized ops, no tags
    request = read_request(b"".join(out))
    assert request.body["topics"] == [{"topic_id": request.body["topics"][0]["topic_id"], "name": "t"}]
    assert request.body["allow_auto_topic_creation"] is True


def test_an_api_versions_response_is_always_v0_headed_and_a_flexible_one_has_a_tagged_header():
    assert response_frame(API_VERSIONS, 3, 5, b"B") == struct.pack(">ii", 5, 5) + b"B"
    assert response_frame(METADATA, 9, 5, b"B") == struct.pack(">ii", 6, 5) + b"\x00B"
    assert response_frame(METADATA, 8, 5, b"B") == struct.pack(">ii", 5, 5) + b"B"


def test_a_version_we_do_not_serve_leaves_the_body_unread():
    request = read_request(struct.pack(">hhih", 1, 99, 3, -1) + b"garbage")
    assert request.api is FETCH and request.body is None and request.client_id is None


@pytest.mark.parametrize("codec", sorted(batches.CODECS))
def test_a_batch_round_trips_in_every_codec_with_keys_headers_nulls_and_gaps(codec):
    rows = [(10, 1_700_000_000_123, b"k", b"v" * 300), (11, 1_700_000_000_124, None, None), (14, 1_699_999_999_000, b"", b"x")]
    data = batches.write_batch(10, rows, codec=codec, headers=[[("h", b"1"), ("n", None)], [], []])
    (batch,) = batches.read_batches(data)
    assert batch.compression == codec and batch.base_offset == 10 and batch.last_offset_delta == 4
    assert [(batch.base_offset + r.offset_delta, r.timestamp, r.key, r.value) for r in batch.records] == rows
    assert batch.records[0].headers == [("h", b"1"), ("n", None)]
    assert batches.read_batches(data + data)[1].records[2].value == b"x"


def test_a_damaged_batch_is_a_decode_error_never_another_exception():
    data = bytearray(batches.write_batch(0, [(0, 1, b"k", b"value")]))
    data[-1] ^= 0xFF
    with pytest.raises(DecodeError, match="CRC"):
        batches.read_batches(bytes(data))
    with pytest.raises(DecodeError, match="magic"):
        batches.read_batches(bytes(data[:16]) + b"\x01" + bytes(data[17:]))


def test_the_pure_crc32c_agrees_with_the_compiled_one():
    assert batches._crc32c_pure(b"123456789") == 0xE3069283
    assert batches._crc(b"123456789") == 0xE3069283


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_the_request_decoder_raises_decode_error_or_parses(frame):
    try:
        read_request(frame)
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 60))
def test_fuzz_a_produce_request_with_damaged_bytes(noise, cut):
    body = {"transactional_id": None, "acks": 1, "timeout_ms": 1,
            "topic_data": [{"name": "t", "partition_data": [
                {"index": 0, "records": batches.write_batch(0, [(0, 1, b"k", b"v")])}]}]}
    frame = request_frame(PRODUCE, 9, body)
    damaged = frame[:cut] + noise + frame[cut + len(noise):]
    try:
        request = read_request(damaged)
    except DecodeError:
        return
    outcome = Mapping("h", 1).handle(request, {"t": TopicView("t", [-1])})
    assert isinstance(outcome, (Appends, Answer))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_the_batch_decoder_raises_decode_error_or_parses(data):
    try:
        batches.read_batches(data)
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**40), st.none() | st.binary(max_size=20),
                          st.none() | st.binary(max_size=50)), min_size=1, max_size=20),
       st.sampled_from(sorted(batches.CODECS)))
def test_fuzz_batches_round_trip(rows, codec):
    offset, records = 100, []
    for gap, ts, key, value in rows:
        records.append((offset, ts, key, value))
        offset += 1 + gap
    (batch,) = batches.read_batches(batches.write_batch(100, records, codec=codec))
    assert [(100 + r.offset_delta, r.timestamp, r.key, r.value) for r in batch.records] == records


# -- the mapping --------------------------------------------------------------------------------


def _decode(api, version: int, body: bytes) -> dict:
    return api.response.read_version(Reader(body), api.is_flexible(version), version)


def test_metadata_lists_the_gateway_as_leader_of_every_partition_and_says_what_is_missing():
    mapping = Mapping("gw.example", 9093, auto_create=False)
    for version in range(METADATA.lo, METADATA.hi + 1):
        request = read_request(request_frame(METADATA, version, {"topics": [{"name": "t"}, {"name": "nope"},
                                                                           {"name": "bad/name"}]}))
        answer = mapping.handle(request, {"t": TopicView("t", [4, -1])})
        body = _decode(METADATA, version, answer.body)
        assert body["brokers"][0]["host"] == "gw.example" and body["brokers"][0]["port"] == 9093
        t, nope, bad = body["topics"]
        assert [p["partition_index"] for p in t["partitions"]] == [0, 1]
        assert all(p["leader_id"] == 1 and p["isr_nodes"] == [1] for p in t["partitions"])
        assert nope["error_code"] == errors.UNKNOWN_TOPIC_OR_PARTITION
        assert bad["error_code"] == errors.INVALID_TOPIC_EXCEPTION


def test_a_metadata_that_may_create_a_topic_says_leader_not_available_until_it_exists():
    mapping = Mapping("h", 1)
    request = read_request(request_frame(METADATA, 9, {"topics": [{"name": "new"}], "allow_auto_topic_creation": True}))
    assert mapping.to_create(request, {}) == ["new"]
    body = _decode(METADATA, 9, mapping.handle(request, {}).body)
    assert body["topics"][0]["error_code"] == errors.LEADER_NOT_AVAILABLE
    forbid = read_request(request_frame(METADATA, 9, {"topics": [{"name": "new"}], "allow_auto_topic_creation": False}))
    assert mapping.to_create(forbid, {}) == []


def test_produce_becomes_appends_and_refuses_what_it_cannot_write():
    good = batches.write_batch(0, [(0, 5, b"k", b"v"), (1, 6, None, b"w")], codec=batches.GZIP)
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": good}, {"index": 5, "records": good},
                                         {"index": 1, "records": good[:-1] + bytes([good[-1] ^ 1])}]}]}
    request = read_request(request_frame(PRODUCE, 7, body))
    outcome = Mapping("h", 1).handle(request, {"t": TopicView("t", [-1, -1])})
    assert isinstance(outcome, Appends) and outcome.acks == -1
    assert [(a.topic, a.index, a.batch.values, a.batch.count) for a in outcome.appends] == [("t", 0, [b"v", b"w"], 2)]
    assert outcome.appends[0].batch.keys == [b"k", None]
    assert outcome.refused == {("t", 5): errors.UNKNOWN_TOPIC_OR_PARTITION, ("t", 1): errors.CORRUPT_MESSAGE}
    response = _decode(PRODUCE, 7, Mapping("h", 1).produce_response(request, {("t", 0): (0, 7), ("t", 5): (3, -1)}))
    assert [(p["index"], p["error_code"], p["base_offset"]) for p in response["responses"][0]["partition_responses"]] \
        == [(0, 0, 7), (5, 3, -1)]
    tiny = Mapping("h", 1, max_request_records_bytes=10).handle(request, {"t": TopicView("t", [-1, -1])})
    assert tiny.refused[("t", 0)] == errors.MESSAGE_TOO_LARGE
    txn = read_request(request_frame(PRODUCE, 7, {**body, "transactional_id": "tx"}))
    assert isinstance(Mapping("h", 1).handle(txn, {}), Answer)


def test_fetch_reads_from_the_offset_and_answers_batches_with_the_high_watermark():
    body = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 10_000, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "",
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 2, "partition_max_bytes": 100},
                                                     {"partition": 1, "fetch_offset": 9, "partition_max_bytes": 100}]}]}
    mapping = Mapping("h", 1)
    for version in range(FETCH.lo, FETCH.hi + 1):
        request = read_request(request_frame(FETCH, version, body))
        views = {"t": TopicView("t", [4, 3])}
        reads = mapping.handle(request, views)
        assert isinstance(reads, Reads) and (reads.max_wait_ms, reads.min_bytes) == (500, 1)
        assert [(r.index, r.offset) for r in reads.reads] == [(0, 2)]
        assert reads.refused == {("t", 1): errors.OFFSET_OUT_OF_RANGE}
        rows = [(2, 7, None, b"c", ()), (3, 8, b"k", b"d", (("h", b"1"), ("n", None)))]
        answer = _decode(FETCH, version, mapping.fetch_response(reads, views, {("t", 0): [rows]}))
        p0, p1 = answer["responses"][0]["partitions"]
        assert (p0["error_code"], p0["high_watermark"]) == (0, 5)
        got = batches.read_batches(p0["records"])[0].records
        assert [(r.value, r.timestamp, r.headers) for r in got] == [(b"c", 7, []), (b"d", 8, [("h", b"1"), ("n", None)])]
        assert p1["error_code"] == errors.OFFSET_OUT_OF_RANGE


def test_list_offsets_earliest_latest_and_max_timestamp():
    body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "timestamp": -2}, {"partition_index": 0, "timestamp": -1},
        {"partition_index": 1, "timestamp": -1}, {"partition_index": 7, "timestamp": -1}]}]}
    for version in range(LIST_OFFSETS.lo, LIST_OFFSETS.hi + 1):
        request = read_request(request_frame(LIST_OFFSETS, version, body))
        answer = _decode(LIST_OFFSETS, version, Mapping("h", 1).handle(request, {"t": TopicView("t", [9, -1])}).body)
        parts = answer["topics"][0]["partitions"]
        assert [(p["error_code"], p["offset"]) for p in parts] == [(0, 0), (0, 10), (0, 0), (3, -1)]


def test_list_offsets_by_timestamp_asks_what_was_held_then_and_answers_the_next_record():
    from dafka.kafka.mapping import Seek
    body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "timestamp": 5000}, {"partition_index": 1, "timestamp": 5000},
        {"partition_index": 2, "timestamp": 5000}, {"partition_index": 0, "timestamp": -1}]}]}
    views = {"t": TopicView("t", [9, 9, 9])}
    for version in range(LIST_OFFSETS.lo, LIST_OFFSETS.hi + 1):
        request = read_request(request_frame(LIST_OFFSETS, version, body))
        seek = Mapping("h", 1).handle(request, views)
        assert isinstance(seek, Seek) and seek.moments == [("t", 5000)]
        held = {("t", 5000): {address_of("t", 0): 3, address_of("t", 1): 9}}  # 2: nobody could tell
        answer = _decode(LIST_OFFSETS, version, Mapping("h", 1).list_offsets(request, views, held))
        parts = answer["topics"][0]["partitions"]
        # the next record after what was held; none after the last; the first kept when nobody can tell
        assert [(p["offset"], p["timestamp"]) for p in parts] == [(4, 5000), (-1, -1), (0, 5000), (10, -1)]


def test_partition_addresses_are_stable_dafka_producer_addresses():
    assert address_of("t", 0) == address_of("t", 0) != address_of("t", 1) != address_of("u", 1)
    assert len(address_of("t", 0)) == 32


def _crecords():
    try:
        return importlib.import_module("dafka.kafka._crecords")
    except ImportError:
        if os.environ.get("DAFKA_EXPECT_EXTENSIONS") is not None:
            raise  # tox built the wheel with its twins: a missing one fails
        pytest.skip("the compiled twins are not built in this checkout (python setup.py build_ext --inplace)")


def test_the_record_codec_runs_compiled_or_pure_as_the_run_expects():
    expected = os.environ.get("DAFKA_EXPECT_EXTENSIONS")
    compiled = records.read_records is not records.PURE["read_records"]
    if expected == "compiled":
        assert compiled
    elif expected == "pure":
        assert not compiled


ROWS = st.lists(st.tuples(st.integers(0, 2 ** 40), st.integers(0, 2 ** 42), st.none() | st.binary(max_size=40),
                          st.none() | st.binary(max_size=300)), min_size=1, max_size=30)
HEADERS = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3)


@settings(max_examples=300, deadline=None)
@given(ROWS, st.integers(0, 2 ** 40), st.integers(0, 2 ** 42), st.data())
def test_fuzz_the_compiled_record_codec_gives_what_the_pure_one_gives(rows, base, first_ts, data):
    twin = _crecords()
    headers = data.draw(st.none() | st.lists(HEADERS, min_size=len(rows), max_size=len(rows)))
    pure_body = call(records.PURE["encode_records"], base, first_ts, rows, headers)
    assert call(twin.encode_records, base, first_ts, rows, headers) == pure_body
    if pure_body[0] == "ok":
        body = pure_body[1]
        assert twin.read_records(body, len(rows), first_ts) == records.PURE["read_records"](body, len(rows), first_ts)
        cut = data.draw(st.integers(0, len(body)))
        flip = data.draw(st.integers(0, 255))
        damaged = body[:cut] + bytes([flip]) + body[cut + 1:]
        for count in (len(rows), len(rows) + 1, max(0, len(rows) - 1)):
            assert call(twin.read_records, damaged, count, first_ts) == \
                call(records.PURE["read_records"], damaged, count, first_ts)
            assert call(twin.read_columns, damaged, count, first_ts) == \
                call(records.PURE["read_columns"], damaged, count, first_ts)
        # the columns: what the records hold, a null value empty, no keys when none has one, and each
        # record's timestamp and headers as dafka attributes (rfc 18.4); a batch without timestamps: none
        values, keys, held = twin.read_columns(body, len(rows), first_ts)
        assert (values, keys, held) == records.PURE["read_columns"](body, len(rows), first_ts)
        assert values == [b"" if v is None else v for _, _, _, v in rows]
        assert keys == (None if all(k is None for _, _, k, _ in rows) else [k for _, _, k, _ in rows])
        assert [a[0] for a in held] == [ts for _, ts, _, _ in rows]
        assert [attributes.decode_headers(a[1]) for a in held] == \
            [tuple(h) for h in (headers or [()] * len(rows))]
        untimed = call(twin.read_columns, body, len(rows), records.NO_TIMESTAMP)
        assert untimed == call(records.PURE["read_columns"], body, len(rows), records.NO_TIMESTAMP)
        assert untimed[0] != "ok" or {a[0] for a in untimed[1][2]} == {attributes.NO_TIME}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(-1, 20), st.integers(-(2 ** 63), 2 ** 63 - 1))
def test_fuzz_the_compiled_record_decoder_on_any_bytes(body, count, first_ts):
    twin = _crecords()
    assert call(twin.read_records, body, count, first_ts) == \
        call(records.PURE["read_records"], body, count, first_ts)
    assert call(twin.read_columns, body, count, first_ts) == call(records.PURE["read_columns"], body, count, first_ts)


FRAME_RECORDS = st.lists(st.tuples(st.binary(max_size=60), st.none() | st.binary(max_size=20),
                                   st.none() | st.integers(0, 2 ** 42), HEADERS), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(FRAME_RECORDS, st.integers(0, 2 ** 40), st.booleans(), st.booleans(),
       st.lists(st.tuples(st.integers(0, 2 ** 40 + 40), st.integers(0, 2 ** 42)), max_size=4), st.integers(0, 2 ** 42),
       st.data())
def test_fuzz_a_stores_answer_becomes_the_kafka_batch_its_records_make(recs, sequence, keyed, timed, stamps,
                                                                       default_ts, data):
    """What a Fetch sends of a message's frames (``encode_frames``, compiled and pure) reads back as the
    records, their timestamps (their own, else their store's stamp at or below their sequence, else the
    default) and headers; damaged frames raise ValueError, never read past them."""
    twin = _crecords()
    stamps = tuple(sorted(stamps))
    values = [v for v, _, _, _ in recs]
    keys = [k for _, k, _, _ in recs] if keyed else [None] * len(recs)
    lengths, contents = encode_pack_contents(values)
    key_lengths, key_blob = encode_pack_keys(keys) if keyed else (b"", b"")
    held = [attributes.record_attributes(h, ts) for _, _, ts, h in recs] if timed else []
    times, header_lengths, header_blob = attributes.pack(held) if timed else (b"", b"", b"")
    msg = DirectKeyedRecordsMsg("consumer", "store", "topic", sequence, lengths, contents, stamps, key_lengths, key_blob,
                                times, header_lengths, header_blob)
    lo = data.draw(st.integers(0, len(recs) - 1))
    hi = data.draw(st.integers(lo + 1, len(recs)))
    pure = call(records.PURE["encode_frames"], msg, lo, hi, default_ts)
    assert call(twin.encode_frames, msg, lo, hi, default_ts) == pure
    body, first_ts, max_ts = pure[1]
    back = records.read_records(body, hi - lo, first_ts)

    def expected_ts(i):
        if timed and recs[i][2] is not None:
            return recs[i][2]
        below = [ms for seq, ms in stamps if seq <= sequence + i]
        return below[-1] if below else default_ts

    assert [(r.offset_delta, r.timestamp, r.key, r.value) for r in back] == \
        [(i - lo, expected_ts(i), keys[i] if keys[i] is not None or not keyed else None, values[i])
         for i in range(lo, hi)]
    assert [r.headers for r in back] == [list(recs[i][3]) if timed else [] for i in range(lo, hi)]
    assert max_ts == max(r.timestamp for r in back)
    # damaged frames: the same error from both, never a read past them
    frame = data.draw(st.sampled_from(["lengths", "contents", "key_lengths", "keys", "header_lengths", "headers"]))
    raw = getattr(msg, frame)
    cut = data.draw(st.integers(0, len(raw)))
    damaged = dataclasses.replace(msg, **{frame: raw[:cut] + data.draw(st.binary(max_size=6))})
    got = call(twin.encode_frames, damaged, lo, hi, default_ts)
    assert got == call(records.PURE["encode_frames"], damaged, lo, hi, default_ts)
    assert got[0] == "ok" or got == ("raised", ValueError)


@pytest.mark.parametrize("with_headers", [False, True])
def test_a_value_length_that_says_null_is_refused_by_both_frame_encoders(with_headers):
    """A dafka value is never null: a length of 2^32-1 (NO_KEY, NULL_VALUE where null exists) in the
    lengths frame is damage, raised as ValueError by the pure and the compiled encoder alike, with or
    without headers (the compiled one writes those records by two paths)."""
    twin = _crecords()
    held = [attributes.record_attributes([("h", b"1")] if with_headers else None, 5)]
    times, header_lengths, header_blob = attributes.pack(held)
    msg = DirectKeyedRecordsMsg("consumer", "store", "topic", 0, struct.pack("<I", 2**32 - 1), b"v", (), b"", b"",
                                times, header_lengths, header_blob)
    assert call(records.PURE["encode_frames"], msg, 0, 1, 0) == ("raised", ValueError)
    assert call(twin.encode_frames, msg, 0, 1, 0) == ("raised", ValueError)
