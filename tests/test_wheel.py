"""The wheel as a user gets it: built from the checkout, installed into a
fresh virtual environment (with nothing of the checkout beside it), where
``dafka demo`` runs the quickstart and every console tool answers --help.

The venv borrows this environment's third-party packages (pyzmq, plyvel...)
through a .pth file, which puts them after its own site-packages: its dafka
is the wheel's, and nothing is downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

# One worker builds the wheel for all of them (tox's --dist loadgroup), once.
pytestmark = pytest.mark.xdist_group("wheel")

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("dafka", "dafka_towerd", "dafka_stored", "dafka_console_producer", "dafka_console_consumer")


def source_copy(into: Path) -> Path:
    """The checkout's sources, without what builds and runs leave in it (build/, *.egg-info, .tox).

    setuptools builds in the source tree: a build in the checkout itself, after tox's own builds there,
    failed in CI ("No such file or directory: build/bdist.linux-x86_64/wheel/./dafka-0.2.0-py3.11.egg-info"),
    and the suite must not write into the checkout anyway."""
    shutil.copytree(ROOT, into, ignore=shutil.ignore_patterns(
        ".git", ".tox", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"))
    return into


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    source = source_copy(tmp / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "--wheel-dir", str(tmp / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("dafka-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    # Only now: seen during the install, this environment's own dafka would make pip skip the wheel
    # ("already satisfied", pip 26).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONSAFEPATH"] = "1"
    return env


def test_the_wheel_is_what_the_venv_imports(wheel_venv):
    where = subprocess.run([str(wheel_venv / "bin" / "python"), "-c",
                            "import dafka, dafka.store, dafka.spark; print(dafka.__file__, dafka.__version__)"],
                           capture_output=True, text=True, timeout=60, cwd=wheel_venv, env=clean_env())
    assert where.returncode == 0, where.stderr
    path, version = where.stdout.split()
    assert path.startswith(str(wheel_venv)), path
    import dafka

    assert version == dafka.__version__


def test_dafka_demo_runs_from_the_wheel(wheel_venv):
    demo = subprocess.run([str(wheel_venv / "bin" / "dafka"), "demo"], capture_output=True, text=True, timeout=120,
                          cwd=wheel_venv, env=clean_env())
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert demo.stdout.strip(), "the demo printed no records"


@pytest.mark.parametrize("tool", TOOLS)
def test_every_console_tool_answers_help(wheel_venv, tool):
    shown = subprocess.run([str(wheel_venv / "bin" / tool), "--help"], capture_output=True, text=True, timeout=60,
                           cwd=wheel_venv, env=clean_env())
    assert shown.returncode == 0, shown.stderr
    assert "Usage:" in shown.stdout
