"""Builds the optional compiled twins (dafka/_c*.pyx; dafka/extensions.py).

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

TWINS = [Extension(f"dafka._c{name}", [f"dafka/_c{name}.pyx"]) for name in ("packing", "outbox")]
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
    return cythonize(TWINS, quiet=True, compiler_directives={"language_level": 3})


setup(ext_modules=twins(), cmdclass={"build_ext": OptionalBuildExt})
