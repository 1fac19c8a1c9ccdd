"""Builds the optional compiled twins (dafka/core/extensions.py): dafka/protocol/_cpacking.pyx,
dafka/producer/outbox.py compiled as dafka.producer._coutbox with the types of dafka/producer/_coutbox.pxd,
and kafka/_crecords.pyx (dafka.kafka).

Everything else about the package is in pyproject.toml.  A twin that cannot be
built (no Cython, no C compiler, a compile error) leaves the package in pure
Python: the build goes on and says so in one line.  ``DAFKA_NO_EXTENSIONS=1``
at build time builds none.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

TWINS = [Extension("dafka.protocol._cpacking", ["dafka/protocol/_cpacking.pyx"]),
         Extension("dafka.producer._coutbox", ["dafka/producer/outbox.py"]),  # the pure module itself, typed by _coutbox.pxd
         Extension("dafka.kafka._crecords", ["kafka/_crecords.pyx"])]  # the Kafka gateway's record codec
NOTICE = "dafka: the compiled extensions were not built ({}); dafka runs in pure Python, slower"


def notice(reason: object) -> None:
    print(NOTICE.format(reason), file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that reports a failure instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all: setuptools raises before any extension
            notice(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            notice(f"{ext.name}: {exc}")


def twins() -> list[Extension]:
    if os.environ.get("DAFKA_NO_EXTENSIONS", "") not in ("", "0"):
        notice("DAFKA_NO_EXTENSIONS is set")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        notice("Cython is not installed")
        return []
    # annotation_typing off: a twin compiled from pure Python takes its types from its .pxd alone, never from
    # its annotations (which say what the pure module accepts); the generated C stays out of the tree.
    return cythonize(TWINS, quiet=True, build_dir="build/cython",
                     compiler_directives={"language_level": 3, "annotation_typing": False})


setup(ext_modules=twins(), cmdclass={"build_ext": OptionalBuildExt})
