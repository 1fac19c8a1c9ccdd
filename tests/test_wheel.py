"""The wheel as a user gets it: built from the checkout, installed into a
fresh virtual environment (with nothing of the checkout beside it), where
``dafka demo`` runs the quickstart and every console tool answers --help.

The venv borrows this environment's third-party packages (pyzmq, plyvel...)
through a .pth file, which puts them after its own site-packages: its dafka
is the wheel's, and nothing is downloaded."""

from __future__ import annotations

import json
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
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = source_copy(tmp / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "--wheel-dir", str(tmp / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (found,) = (tmp / "dist").glob("dafka-*.whl")
    return found


def venv_with(wheel: Path, env_dir: Path, borrowed: str) -> Path:
    """A venv holding the wheel, that borrows third-party packages from the folder ``borrowed`` (.pth)."""
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    # Only now: seen during the install, this environment's own dafka would make pip skip the wheel
    # ("already satisfied", pip 26).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed.pth").write_text(borrowed + "\n")
    return env_dir


@pytest.fixture(scope="session")
def wheel_venv(wheel, tmp_path_factory):
    return venv_with(wheel, tmp_path_factory.mktemp("venv") / "venv", sysconfig.get_paths()["purelib"])


def required_only(into: Path) -> Path:
    """A folder of links to the packages that ``pip install .`` brings (dafka's dependencies without extras,
    and theirs), and nothing else: no pytest, no extra."""
    from importlib import metadata

    from packaging.requirements import Requirement

    into.mkdir()
    wanted = [Requirement(r) for r in metadata.requires("dafka") or ()]
    seen: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        dist = metadata.distribution(requirement.name)
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        for top in {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            if not (into / top).exists():
                (into / top).symlink_to(Path(dist.locate_file(top)))
        wanted.extend(Requirement(r) for r in dist.requires or ())
    return into


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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_bench_command_runs_with_pip_install_alone(wheel, tmp_path, processes):
    """README's bench command, with tiny counts, in a venv that holds the wheel and its required packages only,
    and a copy of bench/ without tests/ beside it: every scenario runs, or says which extra it lacks."""
    from test_bench import TINY

    env_dir = venv_with(wheel, tmp_path / "venv", str(required_only(tmp_path / "required")))
    python = str(env_dir / "bin" / "python")
    assert subprocess.run([python, "-c", "import pytest"], capture_output=True, env=clean_env()).returncode != 0
    shutil.copytree(ROOT / "bench", tmp_path / "checkout" / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in clean_env().items() if k != "PYTHONSAFEPATH"}  # as README runs it
    out = tmp_path / "results.json"
    run = processes.start([python, "bench/run.py", "--json", str(out), *TINY, "--skip", "groups,partitions,recovery"],
                          text=True, cwd=tmp_path / "checkout", env=env)
    stdout, stderr = run.communicate(timeout=840)  # (the processes fixture kills what it left on a timeout)
    assert run.returncode == 0, stderr[-3000:]
    assert "FAILED" not in stdout, stdout[-5000:]
    results = json.loads(out.read_text())
    assert results["runs"]["100"]["direct"]["received"] == 2000 and results["runs"]["100"]["store"]["ack_rate"] > 0
    assert results["bulk"]["100"]["catchup_reference"]["received"] == 2000  # the raw-frame reference consumer
    assert results["mirror"]["sizes"][0]["mirror_rate"] > 0 and results["burst"]["catchup_received"] == 2000
    assert results["cdc"] == {} and "change data capture: skipped (psycopg2 not installed" in stdout
    assert results["ui"] == {} and "web console: skipped (pip install '.[ui]')" in stdout
    assert "Kafka gateway: skipped" in stdout and results["compaction"]["bootstrap"]["skipped"]
    assert results["hold"]["buffered"] == 2000
