"""dafka: brokerless Kafka-style streaming on ZeroMQ, speaking RFC 46 (Dafka)."""

from .config import Config, ConfigError
from .consumer import Consumer
from .errors import BufferFull, Closed, DafkaError, FlushTimeout, RecordTooLarge
from .producer import Producer, SendHandle
from .records import Record, RecordMetadata

__version__ = "0.1.0"

__all__ = [
    "BufferFull", "Closed", "Config", "ConfigError", "Consumer", "DafkaError", "FlushTimeout",
    "Producer", "Record", "RecordMetadata", "RecordTooLarge", "SendHandle",
]
