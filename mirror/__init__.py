"""The mirror between sites (``dafka mirror``): a source site's partitions
copied into a target site under the same addresses, at the same offsets, so
that consumers fail over with their offsets unchanged.

* :mod:`dafka.mirror.state` decides, free of I/O: which partitions to copy,
  from which offset, and what is a loop or a conflict;
* :mod:`dafka.mirror.provenance` is the record a mirror leaves in its target
  site for each partition it takes over;
* :mod:`dafka.mirror.mirror` runs the peers (:class:`Mirror`);
* :mod:`dafka.mirror.cli` is the command line.

See rfc/mirror.md.
"""

from .mirror import Mirror, MirrorError
from .state import Selection

__all__ = ["Mirror", "MirrorError", "Selection"]
