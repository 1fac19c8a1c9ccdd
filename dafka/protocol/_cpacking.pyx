# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of dafka/protocol/packing.py (dafka/core/extensions.py): the same
functions with the same results, in C loops.  tests/test_extensions.py checks
them against the pure ones for any input (hypothesis)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from dafka.records import Record

cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        object (*tp_alloc)(PyTypeObject*, Py_ssize_t)  # a new reference; NULL raises

cdef long long _FAST_OFFSETS = 1LL << 62  # offsets below this are built from a C long long


cdef inline Py_ssize_t _u32le(const uint8_t* p) noexcept nogil:
    return <Py_ssize_t>(p[0] | (p[1] << 8) | (p[2] << 16) | (<uint32_t>p[3] << 24))


cdef inline Py_ssize_t _count(bytes lengths) except -1:
    if PyBytes_GET_SIZE(lengths) % 4:
        raise ValueError("bytes length not a multiple of item size")
    return PyBytes_GET_SIZE(lengths) // 4


cdef inline bytes _slice(const char* data, Py_ssize_t total, Py_ssize_t start, Py_ssize_t size):
    # contents[start:start + size], as a slice gives it past the end
    if start > total:
        start = total
    if size > total - start:
        size = total - start
    return PyBytes_FromStringAndSize(data + start, size)


def split_contents(bytes lengths not None, bytes contents not None):
    cdef Py_ssize_t n = _count(lengths), i, pos = 0, size
    cdef const uint8_t* sizes = <const uint8_t*>PyBytes_AS_STRING(lengths)
    cdef const char* data = PyBytes_AS_STRING(contents)
    cdef Py_ssize_t total = PyBytes_GET_SIZE(contents)
    cdef list out = PyList_New(n)
    cdef bytes value
    for i in range(n):
        size = _u32le(sizes + 4 * i)
        value = _slice(data, total, pos, size)
        pos += size
        Py_INCREF(value)
        PyList_SET_ITEM(out, i, value)
    return out


def split_records(str topic not None, str partition not None, first, bytes lengths not None,
                  bytes contents not None, Py_ssize_t skip=0):
    cdef Py_ssize_t n = _count(lengths), i, pos = 0, size
    cdef const uint8_t* sizes = <const uint8_t*>PyBytes_AS_STRING(lengths)
    cdef const char* data = PyBytes_AS_STRING(contents)
    cdef Py_ssize_t total = PyBytes_GET_SIZE(contents)
    cdef PyTypeObject* record_type = <PyTypeObject*>Record
    cdef long long base = 0
    cdef bint fast
    cdef object offset, record
    cdef bytes value
    if skip < 0:
        skip = 0
    if skip > n:
        skip = n
    cdef list out = PyList_New(n - skip)
    fast = type(first) is int and 0 <= first < _FAST_OFFSETS - n
    if fast:
        base = first
    for i in range(skip):
        pos += _u32le(sizes + 4 * i)
    for i in range(skip, n):
        size = _u32le(sizes + 4 * i)
        value = _slice(data, total, pos, size)
        pos += size
        offset = PyLong_FromLongLong(base + i) if fast else first + i
        record = record_type.tp_alloc(record_type, 4)  # a Record: what tuple.__new__(Record, ...) makes
        Py_INCREF(topic)
        PyTuple_SET_ITEM(record, 0, topic)
        Py_INCREF(partition)
        PyTuple_SET_ITEM(record, 1, partition)
        Py_INCREF(offset)
        PyTuple_SET_ITEM(record, 2, offset)
        Py_INCREF(value)
        PyTuple_SET_ITEM(record, 3, value)
        Py_INCREF(record)
        PyList_SET_ITEM(out, i - skip, record)
    return out


def sequence_keys(bytes prefix not None, start, end):
    if end <= start:
        return []
    if start < 0 or end - 1 > 0xFFFFFFFFFFFFFFFF:
        raise OverflowError("int too big to convert" if start >= 0 else "can't convert negative int to unsigned")
    cdef uint64_t seq = start, stop_at = end - 1
    cdef Py_ssize_t width = PyBytes_GET_SIZE(prefix), k, i = 0
    cdef Py_ssize_t n = <Py_ssize_t>(stop_at - seq + 1)
    cdef const char* head = PyBytes_AS_STRING(prefix)
    cdef list out = PyList_New(n)
    cdef bytes key
    cdef char* at
    while True:
        key = PyBytes_FromStringAndSize(NULL, width + 8)
        at = PyBytes_AS_STRING(key)
        memcpy(at, head, width)
        for k in range(8):
            at[width + k] = <char>((seq >> (56 - 8 * k)) & 0xFF)
        Py_INCREF(key)
        PyList_SET_ITEM(out, i, key)
        i += 1
        if seq == stop_at:
            break
        seq += 1
    return out


def put_all(put, keys, values):
    for key, value in zip(keys, values):
        put(key, value)
