"""The optional compiled twins of the per-record code, in aiokafka's pattern.

A twin (``dafka._c<name>``) mirrors a pure-Python module (``dafka/<name>.py``)
one to one: the same functions and classes, the same results for any input.
``dafka/protocol/_cpacking.pyx`` does it in C loops of its own; ``dafka.producer._coutbox`` is
``dafka/producer/outbox.py`` itself compiled, with the field types ``dafka/producer/_coutbox.pxd``
declares.  ``pip install .`` builds them where it can (setup.py); where it
cannot (no C compiler, no Cython) the package is pure Python and works the
same, only slower.  Whoever uses a twinned module asks :func:`twin` at import
which one to take.

``DAFKA_NO_EXTENSIONS=1`` (any value but empty or ``0``) turns the twins off
for a process and what it starts; it is read once, at import.
``dafka --version`` says which ran.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

ENV = "DAFKA_NO_EXTENSIONS"
DISABLED = os.environ.get(ENV, "") not in ("", "0") or sys.implementation.name != "cpython"
# The pure-Python modules that have a twin.
TWINNED = ("dafka.protocol.packing", "dafka.producer.outbox", "dafka.kafka.records")

def twin(module: str) -> ModuleType | None:
    """The compiled twin of the pure-Python ``module`` (``dafka.protocol.packing``:
    ``dafka.protocol._cpacking``), or None when the twins are turned off or this one
    was not built."""
    if DISABLED:
        return None
    package, _, name = module.rpartition(".")
    try:
        return importlib.import_module(f"{package}._c{name}")
    except ImportError:
        return None


def status() -> dict[str, bool]:
    """Whether each twinned module runs compiled (True) or in pure Python (False) in this process."""
    return {module: twin(module) is not None for module in TWINNED}


def summary() -> str:
    """One line for ``dafka --version``: what runs, and why pure Python if it does."""
    ran = status()
    if all(ran.values()):
        return "compiled extensions: on"
    if DISABLED:
        return f"compiled extensions: off ({ENV} is set)"
    missing = ", ".join(module for module, compiled in ran.items() if not compiled)
    return f"compiled extensions: not built ({missing} in pure Python)"
