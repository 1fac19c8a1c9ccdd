"""Check what ``python -m build`` made (``tox -e package`` runs it):

    python tests/check_dist.py DIST_DIR

* ``twine check --strict`` passes on the sdist and the wheel;
* the wheel's metadata gives the license as an SPDX expression (MPL-2.0) and holds its text;
* the wheel's version is dafka/__init__.py's, and CHANGELOG.md's newest release (a release is bumped in both);
* the wheel holds the dafka package only (no tests, bench, docs or examples),
  with ``py.typed`` and every mapped subpackage;
* the sdist holds what running the tests and building the docs need;
* the wheel holds the compiled twins (dafka/*/_c*.so; dafka/core/extensions.py), and
  the sdist built again where there is no C compiler (``CC=false``) still
  makes a wheel, in pure Python, and says so in one line.
Exits 1 naming what is wrong."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL_PACKAGES = {"dafka", "dafka/protocol", "dafka/producer", "dafka/consumer", "dafka/groups", "dafka/discovery",
                  "dafka/core", "dafka/store", "dafka/towerd", "dafka/cli", "dafka/spark", "dafka/spark/examples",
                  "dafka/cdc", "dafka/mirror", "dafka/ui", "dafka/kafka"}
# the console's pages ship in the wheel (nothing is fetched at run time)
WHEEL_FILES = ["dafka/ui/templates/base.html", "dafka/ui/templates/overview.html", "dafka/ui/static/console.js",
               "dafka/ui/static/console.css"]
SDIST_NEEDS = ["LICENSE", "tox.ini", "pyproject.toml", "CHANGELOG.md", "MANIFEST.in", "tests/conftest.py",
               "tests/data/wire_vectors.txt", "tests/data/store-0.1.0/CURRENT", "tests/faults/faultkit.py",
               "tests/typing/user_code.py", "docs/conf.py", "examples/producer_consumer.py", "rfc/dafka.md",
               "bench/run.py", "bench/dafkabench/scenarios.py", ".ci/run", "setup.py", "dafka/protocol/_cpacking.pyx",
               "dafka/producer/_coutbox.pxd",
               "kafka/_crecords.pyx"]
# the compiled twins the wheel holds (setup.py)
TWINS = ["dafka/protocol/_cpacking", "dafka/producer/_coutbox", "dafka/kafka/_crecords"]
NOTICE = "dafka: the compiled extensions were not built"


def problems(dist: Path) -> list[str]:
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"expected one wheel and one sdist in {dist}, found {[p.name for p in dist.iterdir()]}"]
    out = []
    twine = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])],
                           capture_output=True, text=True)
    if twine.returncode != 0:
        out.append(f"twine check failed:\n{twine.stdout}{twine.stderr}")
    names = zipfile.ZipFile(wheels[0]).namelist()
    tops = {name.split("/")[0] for name in names}
    if {t for t in tops if not t.endswith(".dist-info")} != {"dafka"}:
        out.append(f"the wheel holds more than the dafka package: {sorted(tops)}")
    packages = {name.rsplit("/", 1)[0] for name in names if name.endswith("/__init__.py")}
    if packages != WHEEL_PACKAGES:
        out.append(f"the wheel's packages: {sorted(packages)}, expected {sorted(WHEEL_PACKAGES)}")
    metadata = next((zipfile.ZipFile(wheels[0]).read(n).decode() for n in names if n.endswith(".dist-info/METADATA")), "")
    if "License-Expression: MPL-2.0" not in metadata.splitlines():
        out.append("the wheel's metadata does not say License-Expression: MPL-2.0")
    version = next((line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Version: ")), None)
    out += [f"the wheel's version is {version}, {where} says {expected}" for where, expected in released()
            if expected != version]
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        out.append("the wheel holds no LICENSE")
    if "dafka/py.typed" not in names:
        out.append("the wheel has no dafka/py.typed")
    out += [f"the wheel lacks {need}" for need in WHEEL_FILES if need not in names]
    with tarfile.open(sdists[0]) as sdist:
        root = sdist.getnames()[0].split("/")[0]
        held = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    out += [f"the sdist lacks {need}" for need in SDIST_NEEDS if need not in held]
    if any("__pycache__" in name for name in held):
        out.append(f"the sdist ({root}) holds __pycache__ folders")
    out += [f"the wheel lacks the compiled twin {twin}" for twin in TWINS
            if not any(name.startswith(twin + ".") and name.endswith(".so") for name in names)]
    out += [f"the sdist holds generated C: {name}" for name in held if name.startswith("dafka/") and name.endswith(".c")]
    return out + without_a_compiler(sdists[0])


def released() -> list[tuple[str, str | None]]:
    """The version the checkout says: dafka/__init__.py's, and CHANGELOG.md's newest release heading."""
    root = Path(__file__).resolve().parent.parent
    init = re.search(r'^__version__ = "([^"]+)"', (root / "dafka" / "__init__.py").read_text(), re.M)
    heading = re.search(r"^## \[(\d[^]]*)\]", (root / "CHANGELOG.md").read_text(), re.M)
    return [("dafka/__init__.py", init and init.group(1)), ("CHANGELOG.md", heading and heading.group(1))]


def without_a_compiler(sdist: Path) -> list[str]:
    """The sdist built into a wheel where the C compiler fails (``CC=false``): the build goes on, in pure
    Python, with the notice; the wheel holds every package and no compiled twin."""
    with tempfile.TemporaryDirectory() as into:
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", into, str(sdist)],
                               capture_output=True, text=True, env={**os.environ, "CC": "false", "LDSHARED": "false"})
        if built.returncode != 0:
            return [f"the sdist did not build without a C compiler:\n{built.stdout[-2000:]}{built.stderr[-2000:]}"]
        out = []
        if NOTICE not in built.stdout + built.stderr:
            out.append(f"the build without a C compiler did not say {NOTICE!r}")
        wheels = list(Path(into).glob("*.whl"))
        names = zipfile.ZipFile(wheels[0]).namelist() if len(wheels) == 1 else []
        if {name.rsplit("/", 1)[0] for name in names if name.endswith("/__init__.py")} != WHEEL_PACKAGES:
            out.append(f"the wheel built without a C compiler lacks packages: {[w.name for w in wheels]}")
        out += [f"the wheel built without a C compiler holds {name}" for name in names if name.endswith(".so")]
        return out


if __name__ == "__main__":
    found = problems(Path(sys.argv[1]))
    for problem in found:
        print(problem, file=sys.stderr)
    print("dist ok" if not found else f"{len(found)} problem(s)")
    sys.exit(1 if found else 0)
