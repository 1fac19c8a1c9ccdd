"""``dafka kafka``: a gateway that serves the Kafka protocol in front of a dafka cluster (docs/kafka.md).

:mod:`.wire` and :mod:`.messages` are the protocol's types and messages,
:mod:`.batches` its record batches, :mod:`.mapping` the sans-I/O mapping of
Kafka requests onto dafka, :mod:`.server` the asyncio server that runs it.
"""
