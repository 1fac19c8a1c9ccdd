"""dafka.store: a store that persists every record it hears into LevelDB,
with the reference's key layout, and answers consumers and other stores."""

from .errors import StoreError, StoreLocked
from .store import Store

__all__ = ["Store", "StoreError", "StoreLocked"]
