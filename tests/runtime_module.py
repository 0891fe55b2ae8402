"""Loads the engine's Python binding (the ``_runtime`` extension) from a build's output directory.

The engine-only scripts (tests/gpu, tests/mp/engine_buffers.py, benchmarks/process_sets_engine.py) drive the
engine without TensorFlow, from the package folder or from a build configured without TensorFlow. They load
the extension by its file: putting that folder on ``sys.path`` instead would make every module in it a
top-level module, standing in for packages of the same name (``compression``, ``keras``, ``ray``): JAX's
``from compression import zstd`` then imported smdist_tf/compression.py, and with it TensorFlow.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "smdist_tf"


def load_runtime_module(directory: str | Path | None = None) -> ModuleType:
    """The ``_runtime`` extension in ``directory`` (default: the smdist_tf package folder), loaded by path.

    Raises:
        FileNotFoundError: ``directory`` holds no ``_runtime`` extension for this Python.
    """
    folder = Path(directory) if directory else PACKAGE_DIR
    found = [folder / f"_runtime{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
             if (folder / f"_runtime{suffix}").is_file()]
    if not found:
        raise FileNotFoundError(f"no _runtime extension for this Python in {folder}")
    spec = importlib.util.spec_from_file_location("_runtime", found[0])
    module = importlib.util.module_from_spec(spec)
    sys.modules["_runtime"] = module
    spec.loader.exec_module(module)
    return module
