# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of kafka/records.py (dafka/core/extensions.py): the same
functions with the same results, in C loops.  tests/test_kafka_protocol.py
checks them against the pure ones for any input (hypothesis)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy, memmove

from dafka.kafka.wire import DecodeError

cdef object KafkaRecord = None  # dafka.kafka.records' class, taken at the first call: that module imports this one
from dafka.protocol.attributes import NO_TIME


cdef inline int64_t _varint(const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos) except? -1:
    """A zigzag varint at pos (moved past it), as wire.Reader.varint: at most 64 bits."""
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef uint8_t byte
    cdef Py_ssize_t i = pos[0]
    while True:
        if i >= end:
            raise DecodeError("a varint runs past the end")
        byte = p[i]
        i += 1
        if shift == 63 and byte > 1:
            raise DecodeError("a varint over 64 bits")
        value |= (<uint64_t>(byte & 0x7F)) << shift
        if not byte & 0x80:
            pos[0] = i
            return <int64_t>(value >> 1) ^ -(<int64_t>(value & 1))
        shift += 7


cdef inline object _blob(const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos, int64_t n):
    if n < 0:
        return None
    if n > end - pos[0]:
        raise DecodeError(f"{n} bytes wanted at {pos[0]}, {end - pos[0]} left")
    out = PyBytes_FromStringAndSize(<const char*>p + pos[0], <Py_ssize_t>n)
    pos[0] += <Py_ssize_t>n
    return out


def read_records(bytes body, count, first_ts):
    return _read(body, count, first_ts, None)


def read_columns(bytes body, count, first_ts):
    cdef list keys = []
    cdef list held = []
    values = _read(body, count, first_ts, keys, held)
    return values, (keys if any(k is not None for k in keys) else None), held


cdef list _read(bytes body, count, first_ts, list keys, list held=None):
    """The records (``keys`` None), or their values, their keys appended to ``keys`` and their attributes to
    ``held``: as records.py's _read."""
    global KafkaRecord
    if KafkaRecord is None:
        from dafka.kafka.records import KafkaRecord
    cdef Py_ssize_t end = PyBytes_GET_SIZE(body)
    if count < 0 or count > end:
        raise DecodeError(f"{count} records in {end} bytes")
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t pos = 0, start, i, n_records = count
    cdef int64_t size, n, headers_count, h, ts_delta
    cdef bint columns = keys is not None
    cdef bint timed = first_ts != -1
    cdef list out = []
    cdef _Out blob = _Out() if columns else None  # one record's headers in dafka's encoding, reused
    cdef Py_ssize_t name_start
    for i in range(n_records):
        size = _varint(p, end, &pos)
        start = pos
        if pos >= end:
            raise DecodeError(f"1 bytes wanted at {pos}, 0 left")
        pos += 1  # attributes (unused)
        ts_delta = _varint(p, end, &pos)
        delta = _varint(p, end, &pos)
        key = _blob(p, end, &pos, _varint(p, end, &pos))
        value = _blob(p, end, &pos, _varint(p, end, &pos))
        headers = None if columns else []
        headers_count = _varint(p, end, &pos)
        if columns:
            blob.used = 0
        h = 0
        while h < headers_count:
            n = _varint(p, end, &pos)
            if n < 0 or n > end - pos:
                raise DecodeError(f"{n} bytes wanted at {pos}, {end - pos} left")
            name_start = pos
            try:
                name = PyUnicode_DecodeUTF8(<const char*>p + pos, <Py_ssize_t>n, NULL)
            except UnicodeDecodeError:
                raise DecodeError("a header key that is not UTF-8") from None
            pos += <Py_ssize_t>n
            header_value = _blob(p, end, &pos, _varint(p, end, &pos))
            if not columns:
                headers.append((name, header_value))
            else:  # dafka's encoding of the headers (dafka/protocol/attributes.py): u32 LE lengths, 2^32-1 for null
                blob.u32le(<uint64_t>n)
                blob.raw(<const char*>p + name_start, <Py_ssize_t>n)
                if header_value is None:
                    blob.u32le(0xFFFFFFFF)
                else:
                    blob.u32le(<uint64_t>PyBytes_GET_SIZE(header_value))
                    blob.raw(PyBytes_AS_STRING(header_value), PyBytes_GET_SIZE(header_value))
            h += 1
        if pos - start != size:
            raise DecodeError(f"a record of {pos - start} bytes that said {size}")
        if columns:
            out.append(b"" if value is None else value)
            keys.append(key)
            held.append((first_ts + ts_delta if timed else NO_TIME, blob.take()))
        else:
            out.append(KafkaRecord(delta, first_ts + ts_delta, key, value, headers))
    if pos != end:
        raise DecodeError(f"{end - pos} bytes after the batch's last record")
    return out


cdef inline Py_ssize_t _put_varint(uint8_t* out, int64_t value) noexcept nogil:
    cdef uint64_t v = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    cdef Py_ssize_t n = 0
    while v > 0x7F:
        out[n] = <uint8_t>((v & 0x7F) | 0x80)
        v >>= 7
        n += 1
    out[n] = <uint8_t>v
    return n + 1


cdef inline void _check_cut(Py_ssize_t at, uint64_t n, Py_ssize_t size, str what) except *:
    if <uint64_t>at + n > <uint64_t>size:
        raise ValueError(f"{what} of {n} bytes at {at} of {size}")


cdef class _Out:
    cdef bytearray buf
    cdef Py_ssize_t used

    def __cinit__(self):
        self.buf = bytearray(4096)
        self.used = 0

    cdef inline uint8_t* room(self, Py_ssize_t n) except NULL:
        cdef Py_ssize_t have = len(self.buf)
        if self.used + n > have:
            while self.used + n > have:
                have *= 2
            PyByteArray_Resize(self.buf, have)
        return <uint8_t*>PyByteArray_AS_STRING(self.buf) + self.used

    cdef inline void u32le(self, uint64_t value) except *:
        cdef uint8_t* at = self.room(4)
        at[0] = <uint8_t>(value & 0xFF)
        at[1] = <uint8_t>((value >> 8) & 0xFF)
        at[2] = <uint8_t>((value >> 16) & 0xFF)
        at[3] = <uint8_t>((value >> 24) & 0xFF)
        self.used += 4

    cdef inline void raw(self, const char* data, Py_ssize_t n) except *:
        memcpy(self.room(n), data, n)
        self.used += n

    cdef inline bytes take(self):
        return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(self.buf), self.used)

    cdef inline void varint(self, int64_t value) except *:
        self.used += _put_varint(self.room(10), value)

    cdef inline void dafka_blob(self, const uint8_t* base, Py_ssize_t at, uint64_t n, Py_ssize_t size,
                                str what) except *:
        """``n`` bytes at ``at`` of ``base`` (``size`` long), a blob that dafka's u32 lengths frame (2^32-1:
        null), as Kafka's: its varint length (-1 for null) and its bytes."""
        if n == 0xFFFFFFFF:
            self.varint(-1)
            return
        self.bytes_at(base, at, n, size, what)

    cdef inline void bytes_at(self, const uint8_t* base, Py_ssize_t at, uint64_t n, Py_ssize_t size,
                              str what) except *:
        """``n`` bytes at ``at`` of ``base`` (``size`` long), never null (a value), as Kafka's: its varint
        length and its bytes."""
        _check_cut(at, n, size, what)
        self.varint(<int64_t>n)
        self.raw(<const char*>base + at, <Py_ssize_t>n)

    cdef inline void blob(self, object value) except *:
        cdef bytes raw
        cdef Py_ssize_t n
        if value is None:
            self.varint(-1)
            return
        raw = value
        n = PyBytes_GET_SIZE(raw)
        self.varint(n)
        memcpy(self.room(n), PyBytes_AS_STRING(raw), n)
        self.used += n


def encode_records(base_offset, first_ts, rows, headers=None):
    cdef _Out out = _Out()
    cdef _Out record = _Out()
    cdef Py_ssize_t i = 0
    cdef int64_t ts_delta, delta
    cdef bytes raw
    for row in rows:
        offset, ts, key, value = row[0], row[1], row[2], row[3]
        ts_delta, delta = ts - first_ts, offset - base_offset  # OverflowError beyond 64 bits, as the pure one
        record.used = 0
        record.room(1)[0] = 0
        record.used = 1
        record.varint(ts_delta)
        record.varint(delta)
        record.blob(key)
        record.blob(value)
        kept = headers[i] if headers else ()
        record.varint(len(kept))
        for name, header_value in kept:
            raw = name.encode()
            record.blob(raw)
            record.blob(header_value)
        out.varint(record.used)
        memcpy(out.room(record.used), PyByteArray_AS_STRING(record.buf), record.used)
        out.used += record.used
        i += 1
    return bytes(out.buf[:out.used])


cdef inline Py_ssize_t _varint_size(int64_t value) noexcept nogil:
    """The bytes of ``value`` as a zigzag varint."""
    cdef uint64_t v = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    cdef Py_ssize_t n = 1
    while v > 0x7F:
        v >>= 7
        n += 1
    return n


cdef inline uint64_t _u32le(const uint8_t* p) noexcept nogil:
    return <uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)


cdef inline int64_t _i64le(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(7, -1, -1):
        v = (v << 8) | p[k]
    return <int64_t>v


def encode_frames(frames, Py_ssize_t lo, Py_ssize_t hi, default_ts):
    cdef bytes lengths = frames.lengths, contents = frames.contents, key_lengths = frames.key_lengths
    cdef bytes keys = frames.keys, times = frames.times, header_lengths = frames.header_lengths
    cdef bytes headers = frames.headers
    cdef tuple stamps = tuple(frames.stamps)
    cdef Py_ssize_t count = PyBytes_GET_SIZE(lengths) // 4
    if not (0 <= lo < hi <= count):
        raise ValueError(f"records {lo} to {hi} of {count}")
    if PyBytes_GET_SIZE(lengths) % 4 or PyBytes_GET_SIZE(key_lengths) % 4 or PyBytes_GET_SIZE(times) % 8 or \
            PyBytes_GET_SIZE(header_lengths) % 4:
        raise ValueError("a frame of lengths or times cut short")
    cdef bint keyed = PyBytes_GET_SIZE(key_lengths) > 0
    cdef bint timed = PyBytes_GET_SIZE(times) > 0
    if (keyed and PyBytes_GET_SIZE(key_lengths) < 4 * hi) or \
            (timed and (PyBytes_GET_SIZE(times) < 8 * hi or PyBytes_GET_SIZE(header_lengths) < 4 * hi)):
        raise ValueError(f"frames shorter than {hi} records")
    cdef const uint8_t* sizes = <const uint8_t*>PyBytes_AS_STRING(lengths)
    cdef const uint8_t* key_sizes = <const uint8_t*>PyBytes_AS_STRING(key_lengths)
    cdef const uint8_t* stamps_ms = <const uint8_t*>PyBytes_AS_STRING(times)
    cdef const uint8_t* header_sizes = <const uint8_t*>PyBytes_AS_STRING(header_lengths)
    cdef const uint8_t* value_p = <const uint8_t*>PyBytes_AS_STRING(contents)
    cdef const uint8_t* key_p = <const uint8_t*>PyBytes_AS_STRING(keys)
    cdef const uint8_t* header_p = <const uint8_t*>PyBytes_AS_STRING(headers)
    cdef Py_ssize_t value_size = PyBytes_GET_SIZE(contents), key_size = PyBytes_GET_SIZE(keys)
    cdef Py_ssize_t header_size = PyBytes_GET_SIZE(headers)
    cdef Py_ssize_t value_at = 0, key_at = 0, header_at = 0, i, pos, blob_end, count_at
    cdef uint64_t n, value_n, key_n, sequence = frames.sequence
    cdef Py_ssize_t size
    cdef int64_t stamp_ts = default_ts, ts, first_ts = 0, max_ts = 0, headers_n
    cdef Py_ssize_t stamp = 0, stamps_n = len(stamps)
    cdef uint8_t* at
    for i in range(lo):
        value_at += <Py_ssize_t>_u32le(sizes + 4 * i)
        if keyed:
            n = _u32le(key_sizes + 4 * i)
            if n != 0xFFFFFFFF:
                key_at += <Py_ssize_t>n
        if timed:
            header_at += <Py_ssize_t>_u32le(header_sizes + 4 * i)
    cdef _Out out = _Out()
    cdef _Out record = _Out()
    out.room(value_size - value_at + key_size - key_at + header_size - header_at + 32 * (hi - lo))  # (about)
    for i in range(lo, hi):
        while stamp < stamps_n and <uint64_t>stamps[stamp][0] <= sequence + <uint64_t>i:
            stamp_ts = stamps[stamp][1]
            stamp += 1
        ts = stamp_ts
        if timed:
            ts = _i64le(stamps_ms + 8 * i)
            if ts == NO_TIME:
                ts = stamp_ts
        if i == lo:
            first_ts = max_ts = ts
        elif ts > max_ts:
            max_ts = ts
        if (first_ts < 0 and ts > INT64_MAX + first_ts) or (first_ts > 0 and ts < INT64_MIN + first_ts):
            raise OverflowError(f"a timestamp delta beyond 64 bits: {ts} - {first_ts}")
        n = _u32le(header_sizes + 4 * i) if timed else 0
        if n == 0:  # no headers: its size known ahead, the record is written in place
            value_n = _u32le(sizes + 4 * i)
            _check_cut(value_at, value_n, value_size, "a value")
            key_n = _u32le(key_sizes + 4 * i) if keyed else 0xFFFFFFFF
            size = 2 + _varint_size(ts - first_ts) + _varint_size(i - lo) + _varint_size(<int64_t>value_n) + \
                <Py_ssize_t>value_n
            if key_n == 0xFFFFFFFF:
                size += 1
            else:
                _check_cut(key_at, key_n, key_size, "a key")
                size += _varint_size(<int64_t>key_n) + <Py_ssize_t>key_n
            out.varint(size)
            out.room(size)[0] = 0
            out.used += 1
            out.varint(ts - first_ts)
            out.varint(i - lo)
            out.dafka_blob(key_p, key_at, key_n, key_size, "a key")
            if key_n != 0xFFFFFFFF:
                key_at += <Py_ssize_t>key_n
            out.bytes_at(value_p, value_at, value_n, value_size, "a value")
            value_at += <Py_ssize_t>value_n
            out.room(1)[0] = 0  # no headers
            out.used += 1
            continue
        record.used = 0
        record.room(1)[0] = 0
        record.used = 1
        record.varint(ts - first_ts)
        record.varint(i - lo)
        n = _u32le(key_sizes + 4 * i) if keyed else 0xFFFFFFFF
        record.dafka_blob(key_p, key_at, n, key_size, "a key")
        if n != 0xFFFFFFFF:
            key_at += <Py_ssize_t>n
        n = _u32le(sizes + 4 * i)
        record.bytes_at(value_p, value_at, n, value_size, "a value")
        value_at += <Py_ssize_t>n
        n = _u32le(header_sizes + 4 * i)
        _check_cut(header_at, n, header_size, "headers")
        pos, blob_end = header_at, header_at + <Py_ssize_t>n
        header_at = blob_end
        headers_n = 0
        record.room(10)
        count_at = record.used
        record.used += 10  # room for the count's varint, moved down once it is known
        while pos < blob_end:
            _check_cut(pos, 4, blob_end, "a header name's length")
            n = _u32le(header_p + pos)
            _check_cut(pos + 4, n, blob_end, "a header name")
            record.varint(<int64_t>n)
            record.raw(<const char*>header_p + pos + 4, <Py_ssize_t>n)
            pos += 4 + <Py_ssize_t>n
            _check_cut(pos, 4, blob_end, "a header value's length")
            n = _u32le(header_p + pos)
            pos += 4
            record.dafka_blob(header_p, pos, n, blob_end, "a header value")
            if n != 0xFFFFFFFF:
                pos += <Py_ssize_t>n
            headers_n += 1
        at = <uint8_t*>PyByteArray_AS_STRING(record.buf)
        n = <uint64_t>_put_varint(at + count_at, headers_n)
        memmove(at + count_at + n, at + count_at + 10, record.used - count_at - 10)
        record.used -= 10 - <Py_ssize_t>n
        out.varint(record.used)
        memcpy(out.room(record.used), PyByteArray_AS_STRING(record.buf), record.used)
        out.used += record.used
    return out.take(), first_ts, max_ts
