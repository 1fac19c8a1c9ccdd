"""Runnable examples of the dafka Spark connector (``python -m dafka.spark.examples.<name>``)."""
