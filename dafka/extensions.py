"""The optional compiled twins of the per-record code, in aiokafka's pattern.

A twin is a Cython module (``dafka/_c<name>.pyx``) that mirrors a pure-Python
module (``dafka/<name>.py``) one to one: the same functions and classes, the
same results for any input, in C loops and typed fields.  ``pip install .`` builds them where it can
(setup.py); where it cannot (no C compiler, no Cython) the package is pure
Python and works the same, only slower.  The pure module asks :func:`twin` at
its import and takes the twin's functions in place of its own.

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
TWINNED = ("dafka.packing", "dafka.outbox")

_compiled: dict[str, bool] = {}  # pure module -> its twin is in use


def twin(module: str) -> ModuleType | None:
    """The compiled twin of the pure-Python ``module`` (``dafka.packing``:
    ``dafka._cpacking``), or None when the twins are turned off or this one
    was not built."""
    package, _, name = module.rpartition(".")
    found = None
    if not DISABLED:
        try:
            found = importlib.import_module(f"{package}._c{name}")
        except ImportError:
            found = None
    _compiled[module] = found is not None
    return found


def status() -> dict[str, bool]:
    """Whether each twinned module runs compiled (True) or in pure Python (False) in this process."""
    for module in TWINNED:
        importlib.import_module(module)
    return {module: _compiled[module] for module in TWINNED}


def summary() -> str:
    """One line for ``dafka --version``: what runs, and why pure Python if it does."""
    ran = status()
    if all(ran.values()):
        return "compiled extensions: on"
    if DISABLED:
        return f"compiled extensions: off ({ENV} is set)"
    missing = ", ".join(module for module, compiled in ran.items() if not compiled)
    return f"compiled extensions: not built ({missing} in pure Python)"
