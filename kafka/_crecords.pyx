# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of kafka/records.py (dafka/core/extensions.py): the same
functions with the same results, in C loops.  tests/test_kafka_protocol.py
checks them against the pure ones for any input (hypothesis)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

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
