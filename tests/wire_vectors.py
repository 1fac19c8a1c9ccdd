"""Loader for the golden wire vectors of the C reference.

The vectors are frames made by the reference's own encoder (zeromq/dafka,
``dafka_proto_send``).  The repository keeps its own copy in
``tests/data/wire_vectors.txt`` (refreshed from the project's
``shared/wire/vectors.txt``), so that a bare clone tests against them: no test
reads anything outside the checkout.  A missing or unreadable copy fails the
test run loudly instead of skipping.

File format: one ZeroMQ frame per line, ``NAME frameN HEX``; an empty frame has
nothing after the space; lines starting with ``#`` and blank lines are ignored.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

_LABEL = re.compile(r"frame([1-9][0-9]*)")


def vectors_path() -> Path:
    """The vendored copy of the reference's golden vectors."""
    return Path(__file__).resolve().parent / "data" / "wire_vectors.txt"


def parse_vectors(text: str, source: str = "vectors.txt") -> dict[str, list[bytes]]:
    """Parse the vectors file format into ``{name: [frame1, frame2, ...]}``."""
    vectors: dict[str, list[bytes]] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        # "NAME frameN HEX"; an empty frame is "NAME frameN " (or "NAME frameN"
        # if an editor stripped the trailing space).
        parts = raw.strip().split(" ")
        if len(parts) == 2:
            parts.append("")
        match = _LABEL.fullmatch(parts[1]) if len(parts) == 3 else None
        try:
            frame = bytes.fromhex(parts[2]) if match else None
        except ValueError:
            frame = None
        if frame is None:
            raise ValueError(f"{source}:{lineno}: cannot parse vector line {raw!r}")
        name = parts[0]
        frames = vectors.setdefault(name, [])
        index = int(match[1])
        if index != len(frames) + 1:
            raise ValueError(
                f"{source}:{lineno}: {name} frame{index} out of order "
                f"(expected frame{len(frames) + 1})"
            )
        frames.append(frame)
    if not vectors:
        raise ValueError(f"{source}: no vectors found")
    return vectors


@lru_cache(maxsize=None)
def _load(path: str) -> dict[str, tuple[bytes, ...]]:
    text = Path(path).read_text(encoding="ascii")
    return {name: tuple(frames) for name, frames in parse_vectors(text, path).items()}


def load_vectors() -> dict[str, list[bytes]]:
    """The golden vectors, name -> frames in order.  Fails the test run if the
    shared file is missing or unreadable."""
    path = vectors_path()
    if not path.is_file():
        pytest.fail(
            f"golden wire vectors not found at {path}: the repository's copy of the reference's "
            f"vectors is missing",
            pytrace=False,
        )
    try:
        loaded = _load(str(path))
    except (OSError, ValueError) as exc:
        pytest.fail(f"cannot read golden wire vectors {path}: {exc}", pytrace=False)
    return {name: list(frames) for name, frames in loaded.items()}
