"""Loads the native pieces: the build record, the runtime bindings and the TF op library."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import tensorflow as tf

_PACKAGE_DIR = Path(__file__).resolve().parent
_REBUILD_HINT = "rebuild it with `pip install --no-build-isolation -e .` (or `python cc_ops/build.py`)"


def read_build_info() -> dict:
    """Returns what the native build recorded (TensorFlow version, MPI flavour)."""
    path = _PACKAGE_DIR / "build_info.json"
    if not path.exists():
        raise ImportError(f"smdist_tf's native libraries are not built: {_REBUILD_HINT}")
    return json.loads(path.read_text())


def check_tensorflow_version(built_against: str, installed: str) -> None:
    """Raises ImportError when the installed TensorFlow is not the one the ops were built for.

    Custom ops use TensorFlow's C++ ABI, which changes between releases: loading
    them into another version crashes or misbehaves, so we refuse up front.
    """
    if built_against != installed:
        raise ImportError(
            f"smdist_tf was built against TensorFlow {built_against} but TensorFlow "
            f"{installed} is installed: {_REBUILD_HINT}"
        )


def load() -> tuple[ModuleType, ModuleType, dict]:
    """Checks the build and returns (runtime bindings, TF op module, build info)."""
    info = read_build_info()
    check_tensorflow_version(info["tensorflow_version"], tf.__version__)
    from smdist_tf import _runtime  # noqa: PLC0415 - after the version check on purpose

    ops = tf.load_op_library(str(_PACKAGE_DIR / "smdist_tf_ops.so"))
    return _runtime, ops, info


runtime, op_module, build_info = load()
