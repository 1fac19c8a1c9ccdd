# The compiled twin of dafka/producer/outbox.py is that same file compiled by Cython as dafka.producer._coutbox (setup.py), with
# the types this file declares: Outbox becomes a class with typed fields, so that publish(), once per record,
# reads and writes them in C.  Sequences stay Python ints (they run to 2^64-1, as in the pure class); byte
# counts are C integers.  One source for both: tests/test_extensions.py runs both through the same calls.
cimport cython

cdef double BURST_GAP
cdef Py_ssize_t MAX_RECORDS, MAX_BYTES, ATTRIBUTES_OVERHEAD

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
    cdef public dict attributes
    cdef public object released
    cdef public Py_ssize_t published_bytes
    cdef public list batch
    cdef public object batch_keys
    cdef public object batch_attributes
    cdef public Py_ssize_t batch_bytes
    cdef public object batch_first
    cdef public bint batch_due
    cdef public double last_publish
    cdef public object times
    cdef public double note_due

    @cython.locals(size=Py_ssize_t, batch=list)
    cpdef publish(self, content, double now=*)
    cpdef _drop_oldest(self)
