"""dafka: brokerless Kafka-style streaming on ZeroMQ, speaking RFC 46 (Dafka)."""

__version__ = "0.1.0"
