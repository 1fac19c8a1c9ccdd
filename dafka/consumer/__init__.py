"""The consumer: the public :class:`~dafka.consumer.consumer.Consumer`, its sans-I/O state, where
``latest`` starts each partition, and the positions it keeps on disk."""
