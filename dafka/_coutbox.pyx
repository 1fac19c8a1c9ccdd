# cython: language_level=3
"""The compiled twin of dafka/outbox.py (dafka/extensions.py): the same class
with typed fields, so that publish(), once per record, reads and writes them
in C.  Sequences stay Python ints (they run to 2^64-1, as in the pure class);
byte counts are C integers.  tests/test_extensions.py runs both classes
through the same calls (hypothesis) and compares every field."""

from collections import deque

from dafka import batching

cdef double BURST_GAP = batching.BURST_GAP
cdef Py_ssize_t MAX_RECORDS = batching.MAX_RECORDS
cdef Py_ssize_t MAX_BYTES = batching.MAX_BYTES


cdef class Outbox:
    cdef public object min_acks
    cdef public Py_ssize_t max_unacked
    cdef public Py_ssize_t max_unacked_bytes
    cdef public object audience
    cdef public object next_seq
    cdef public object base
    cdef public object buffer
    cdef public Py_ssize_t buffered_bytes
    cdef public dict keys
    cdef public object released
    cdef public Py_ssize_t published_bytes
    cdef public list batch
    cdef public object batch_keys
    cdef public Py_ssize_t batch_bytes
    cdef public object batch_first
    cdef public bint batch_due
    cdef public double last_publish

    def __init__(self, min_acks, Py_ssize_t max_unacked, Py_ssize_t max_unacked_bytes, audience):
        self.min_acks = min_acks
        self.max_unacked = max_unacked
        self.max_unacked_bytes = max_unacked_bytes
        self.audience = audience
        self.next_seq = 0
        self.base = 0
        self.buffer = deque()
        self.buffered_bytes = 0
        self.keys = {}
        self.released = -1
        self.published_bytes = 0
        self.batch = []
        self.batch_keys = None
        self.batch_bytes = 0
        self.batch_first = 0
        self.batch_due = False
        self.last_publish = float("-inf")

    def publish(self, content, double now=0.0):
        cdef object buffer = self.buffer
        cdef Py_ssize_t size = len(content)
        cdef list batch
        if self.min_acks:
            if buffer and (len(buffer) >= self.max_unacked or self.buffered_bytes + size > self.max_unacked_bytes):
                return -1
            buffer.append(content)
            self.buffered_bytes += size
            seq = self.next_seq
        else:
            buffer.append(content)
            self.buffered_bytes += size
            seq = self.released = self.next_seq
            while len(buffer) > self.max_unacked or self.buffered_bytes > self.max_unacked_bytes:
                self._drop_oldest()
        self.next_seq = seq + 1
        self.published_bytes += size
        if self.audience.batches:
            batch = self.batch
            if not batch:
                self.batch_first = seq
            batch.append(content)
            self.batch_bytes += size
            self.batch_due = (now - self.last_publish >= BURST_GAP or len(batch) >= MAX_RECORDS
                              or self.batch_bytes >= MAX_BYTES)
            self.last_publish = now
        return seq

    def _drop_oldest(self):
        content = self.buffer.popleft()
        self.buffered_bytes -= len(content)
        if self.keys:
            key = self.keys.pop(self.base, None)
            if key is not None:
                self.buffered_bytes -= len(key)
        self.base += 1
