"""The web console (``dafka ui``): a peer that observes the cluster
(:mod:`.peer`), what it knows (:mod:`.model`, sans-I/O), and the pages
(:mod:`.app`).  Needs the ``ui`` extra: ``pip install 'dafka[ui]'``."""
