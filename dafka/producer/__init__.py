"""The producer: the public :class:`~dafka.producer.producer.Producer` (one partition of one topic), its
sans-I/O state, the outbox of what it holds, and the resume of a partition from the stores' heads."""
