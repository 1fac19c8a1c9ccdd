"""What a running store leaves in its database directory so that whoever
reads the directory can reach the store instead (the Spark source's
``path``): LevelDB lets one process open a directory at a time, and a
running store holds it.

The file :data:`FILE` (JSON) names the store's process, its reader's address,
the reader's data endpoint (its XPUB, where answers come from) and its
*request* endpoint: a SUB the reader binds besides the one that connects to
every peer, so that a requester that knows the directory, and no tower, can
connect its own XPUB there and send FETCH and GET-HEADS.  The store writes the
file when it starts and removes it when it stops.  A store that was killed
leaves it behind, so a reader trusts it only while the process it names holds
the directory's LevelDB lock; a copy of the directory is read directly.

LevelDB ignores files whose names it did not make, and so does a reference
store opening the same directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

FILE = "dafka-store.json"


@dataclass(frozen=True)
class RunningStore:
    pid: int
    reader: str  # the reader's address
    data: str  # its XPUB endpoint: answers come from there (a requester's SUB connects to it)
    requests: str  # its bound SUB endpoint: a requester's XPUB connects to it to send requests
    curve: bool  # both are CURVE servers (security/curve)


def write(path: str, store: RunningStore) -> None:
    """Leave ``store`` in the directory ``path`` (atomically: readers never see half a file)."""
    target = os.path.join(path, FILE)
    partial = f"{target}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(asdict(store), f)
    os.replace(partial, target)


def remove(path: str) -> None:
    try:
        os.remove(os.path.join(path, FILE))
    except FileNotFoundError:
        pass


def read(path: str) -> RunningStore | None:
    """What the directory says about the store running on it (None: no file,
    or one that cannot be read); whether that store still runs is for the
    caller to check against the directory's lock."""
    try:
        with open(os.path.join(path, FILE), encoding="utf-8") as f:
            fields = json.load(f)
        return RunningStore(int(fields["pid"]), str(fields["reader"]), str(fields["data"]), str(fields["requests"]),
                            bool(fields["curve"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
