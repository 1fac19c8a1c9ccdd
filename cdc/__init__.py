"""Change data capture: a database's commits into a dafka topic (``dafka cdc``).

* :mod:`dafka.cdc.pgoutput` decodes PostgreSQL's logical replication messages;
* :mod:`dafka.cdc.capture` assembles transactions into change envelopes
  (:mod:`dafka.cdc.envelope`, values mapped by :mod:`dafka.cdc.types`) and
  decides what the slot may confirm;
* :mod:`dafka.cdc.postgres` is the connector (slot, publication, bootstrap,
  streaming) around them;
* :mod:`dafka.cdc.apply` is the consumer's side: apply each change once.

See rfc/cdc.md for the envelope and the guarantees.
"""
