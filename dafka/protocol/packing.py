"""The per-record loops over a batch: a consumer splitting the contents of
RECORDS and DIRECT-RECORDS into :class:`~dafka.records.Record` (rfc/dafka.md
sections 12 and 13), a store writer building the LevelDB keys of a batch and
putting them in a write batch.

Kept apart from the codec (:mod:`dafka.protocol.encoding`, :mod:`dafka.protocol.decoding`) because each function here has
a compiled twin, ``dafka/protocol/_cpacking.pyx``, that gives the same result for any
input in a C loop (:mod:`dafka.core.extensions`; ``DAFKA_NO_EXTENSIONS=1`` keeps
these).  The pure versions already run no Python bytecode per record (``map``
over ``slice`` and ``accumulate``); the twins also skip building the
intermediate objects.
"""

from __future__ import annotations

import sys
from array import array
from itertools import accumulate, count, repeat
from typing import Any, Callable, Sequence

from ..core import extensions
from ..records import Record, make_record

# u32 lengths of (DIRECT-)RECORDS' frame 2, little-endian on the wire
U32 = next(code for code in "IL" if array(code).itemsize == 4)
SWAP = sys.byteorder != "little"


def lengths_of(raw: bytes) -> array[int]:
    """The u32 little-endian lengths of a lengths frame (its size a multiple of 4: :class:`ValueError`
    otherwise)."""
    lengths = array(U32)
    lengths.frombytes(raw)
    if SWAP:
        lengths.byteswap()
    return lengths


def split_contents(lengths: bytes, contents: bytes) -> list[bytes]:
    """The contents of a decoded DIRECT-RECORDS, one bytes object per record,
    sliced in C (``map`` over ``slice`` and ``accumulate``).  Lengths that
    run past the contents give what a slice does: shorter or empty values."""
    sizes = lengths_of(lengths)
    return list(map(contents.__getitem__, map(slice, accumulate(sizes, initial=0), accumulate(sizes))))


def split_records(topic: str, partition: str, first: int, lengths: bytes, contents: bytes,
                  skip: int = 0) -> list[Record[bytes]]:
    """Records ``first + skip, first + skip + 1, ...`` of a partition, one per
    content of a batch whose first record is ``first``; the first ``skip``
    contents (already delivered) are left out."""
    values = split_contents(lengths, contents)
    if skip > 0:
        del values[:skip]
    return list(map(make_record, zip(repeat(topic), repeat(partition), count(first + max(skip, 0)), values)))


def sequence_keys(prefix: bytes, start: int, end: int) -> list[bytes]:
    """``prefix`` followed by each sequence of ``start .. end-1`` as 8 bytes,
    big-endian: the LevelDB keys of a partition's records (store/keys.py)."""
    return list(map(prefix.__add__, map(int.to_bytes, range(start, end), repeat(8),  # type: ignore[arg-type]
                                        repeat("big"))))  # (mypy reads "big" as a str, not the Literal)


def put_all(put: Callable[[bytes, bytes], Any], keys: Sequence[bytes], values: Sequence[bytes]) -> None:
    """``put(key, value)`` for each pair, in order (a LevelDB write batch's put)."""
    for key, value in zip(keys, values):
        put(key, value)


PURE = {"split_contents": split_contents, "split_records": split_records, "sequence_keys": sequence_keys,
        "put_all": put_all}
"""The pure-Python functions, whichever run (the twin's tests compare them)."""

_twin = extensions.twin(__name__)
if _twin is not None:
    split_contents = _twin.split_contents
    split_records = _twin.split_records
    sequence_keys = _twin.sequence_keys
    put_all = _twin.put_all
