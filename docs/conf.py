"""Sphinx configuration of dafka-py's documentation (``tox -e docs``).

Sphinx rather than MkDocs: autodoc and napoleon read the docstrings as they
are written (reST roles such as :class:`Producer`), sphinx-click documents the
click commands from the commands themselves, and MyST reads the Markdown the
RFC, the changelog and these pages are written in.  The configuration keys'
table is generated from ``dafka.config.KEYS`` at every build."""

from __future__ import annotations

import re
from pathlib import Path

import dafka
from dafka.config import KEYS

project = "dafka-py"
author = "the dafka-py developers"
release = version = dafka.__version__
copyright = "the dafka-py developers, MPL-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_click",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated"]  # _generated/config-keys.md is included by configuration.md
html_theme = "furo"
html_title = f"dafka-py {release}"
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# The C reference and libraries are linked by URL; nothing is fetched at build time.
suppress_warnings = ["myst.header"]
# The docs env installs dafka without its extras: the Spark and CDC modules' third-party imports are mocked.
autodoc_mock_imports = ["pyspark", "numpy", "pyarrow", "pandas", "psycopg2", "pymysqlreplication", "pymysql"]


def _config_keys(app: object) -> None:
    """docs/_generated/config-keys.md: every key with its type, default and meaning."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path in sorted(KEYS):
        key = KEYS[path]
        kind = key.kind + (f" ({key.unit})" if key.unit else "")
        if key.choices:
            kind += ": " + ", ".join(key.choices)
        default = "`" + repr(key.default).replace("|", "\\|") + "`"
        rows.append(f"| `{path}` | {kind} | {default} | {key.doc.replace('|', '/')} |")
    out = Path(__file__).with_name("_generated")
    out.mkdir(exist_ok=True)
    text = "\n".join(rows) + "\n"
    target = out / "config-keys.md"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


_REST_SPECIALS = re.compile(r"([*`|\\]|_(?=\W|$))")


def _help_as_printed(app: object, ctx: object, lines: list[str]) -> None:
    """A command's help as ``--help`` prints it: a literal block (the text is
    written for a terminal, where ``*``, ``dafka_stored`` or ``\\b`` mean nothing)."""
    text = [line for line in lines if line.strip() != "\\b"]
    if any(line.strip() for line in text):
        lines[:] = ["::", ""] + ["    " + line for line in text] + [""]


def _options_as_text(app: object, ctx: object, lines: list[str]) -> None:
    """Option help is one paragraph of plain text: reST's specials are escaped."""
    lines[:] = [line if line.lstrip().startswith((".. ", ":")) else _REST_SPECIALS.sub(r"\\\1", line)
                for line in lines]


def setup(app: object) -> None:
    app.connect("builder-inited", _config_keys)  # type: ignore[attr-defined]
    app.connect("sphinx-click-process-description", _help_as_printed)  # type: ignore[attr-defined]
    app.connect("sphinx-click-process-options", _options_as_text)  # type: ignore[attr-defined]
    app.connect("sphinx-click-process-epilog", _help_as_printed)  # type: ignore[attr-defined]
