"""The exceptions of the public API."""

from __future__ import annotations


class DafkaError(Exception):
    """Base class of every error dafka raises on purpose."""


class RecordTooLarge(DafkaError, ValueError):
    """A record is larger than ``producer/max_record_bytes``; nothing was sent."""


class BufferFull(DafkaError, TimeoutError):
    """``send`` waited ``producer/send_timeout`` for room among the unacked records."""


class FlushTimeout(DafkaError, TimeoutError):
    """Records were still unacked when ``flush``/``close`` gave up; ``unacked`` says how many."""

    def __init__(self, message: str, unacked: int) -> None:
        super().__init__(message)
        self.unacked = unacked


class Closed(DafkaError):
    """The producer or consumer has been closed."""


class ResumeError(DafkaError):
    """A resuming producer could not learn its partition's head from enough
    stores (``producer/resume_timeout``); it sent nothing."""


class PartitionClaimed(ResumeError):
    """Another live process beacons the partition's address: a partition has
    one writer, so this producer refuses to write it."""
