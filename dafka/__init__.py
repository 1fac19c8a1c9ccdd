"""dafka: brokerless Kafka-style streaming on ZeroMQ, speaking RFC 46 (Dafka).

The public names are imported on first use (PEP 562): a process that only
produces does not import the consumer, and start-up is a good part of what a
short-lived producer costs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

_WHERE = {
    "BufferFull": "errors", "Closed": "errors", "DafkaError": "errors", "FlushTimeout": "errors",
    "RecordTooLarge": "errors", "ResumeError": "errors", "PartitionClaimed": "errors",
    "Config": "config", "ConfigError": "config", "Consumer": "consumer.consumer",
    "Producer": "producer.producer", "SendHandle": "producer.producer", "Record": "records",
    "RecordMetadata": "records", "TopicPartition": "records", "ConsumerRebalanceListener": "groups.membership",
    "partition_address": "core.addresses",
}

__all__ = [
    "BufferFull", "Closed", "Config", "ConfigError", "Consumer", "ConsumerRebalanceListener", "DafkaError",
    "FlushTimeout", "PartitionClaimed", "Producer", "Record", "RecordMetadata", "RecordTooLarge", "ResumeError",
    "SendHandle", "TopicPartition", "partition_address",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dafka' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:
    from .config import Config, ConfigError
    from .consumer.consumer import Consumer
    from .core.addresses import partition_address
    from .errors import BufferFull, Closed, DafkaError, FlushTimeout, PartitionClaimed, RecordTooLarge, ResumeError
    from .groups.membership import ConsumerRebalanceListener
    from .producer.producer import Producer, SendHandle
    from .records import Record, RecordMetadata, TopicPartition
