"""Loads the native pieces: the build record, the runtime bindings and the TF op library."""

from __future__ import annotations

import json
import os
import shlex
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

import tensorflow as tf

_PACKAGE_DIR = Path(__file__).resolve().parent


def rebuild_hint(package_dir: Path = _PACKAGE_DIR) -> str:
    """How to rebuild the native libraries for the TensorFlow this Python imports.

    In a source checkout (an editable install, or running from the tree) that is the
    editable install of the checkout with this Python, given by absolute paths so it
    works from any directory: its CMake configure asks TensorFlow and MPI again, and
    the build recompiles whatever their change touches. An installed copy is rebuilt by
    installing again from the source tree.
    """
    source_dir = package_dir.parent
    if (source_dir / "CMakeLists.txt").is_file():
        return (f"rebuild it with `{shlex.quote(sys.executable)} -m pip install --no-build-isolation --no-deps "
                f"-e {shlex.quote(str(source_dir))}`")
    return (f"install the smdist_tf wheel built for the installed TensorFlow (its version ends in +tf<version>), "
            f"or rebuild it from the smdist_tf source directory with "
            f"`{shlex.quote(sys.executable)} -m pip install --no-build-isolation --no-deps .`")


def read_build_info() -> dict:
    """Returns what the native build recorded (TensorFlow version, MPI flavour)."""
    path = _PACKAGE_DIR / "build_info.json"
    if not path.exists():
        raise ImportError(f"smdist_tf's native libraries are not built: {rebuild_hint()}")
    return json.loads(path.read_text())


def check_tensorflow_version(built_against: str, installed: str) -> None:
    """Raises ImportError when the installed TensorFlow is not the one the ops were built for.

    Custom ops use TensorFlow's C++ ABI, which changes between releases: loading
    them into another version crashes or misbehaves, so we refuse up front.
    """
    if built_against != installed:
        raise ImportError(
            f"smdist_tf was built against TensorFlow {built_against} but TensorFlow "
            f"{installed} is installed: {rebuild_hint()}"
        )


# Where the pip packages of NCCL and the CUDA runtime (what ``tensorflow[and-cuda]``
# installs) keep their libraries, below a site-packages folder.
_PIP_GPU_LIBRARIES = {
    "SMDIST_NCCL_LIBRARY": ["nvidia/nccl/lib/libnccl.so.2"],
    "SMDIST_CUDA_RUNTIME_LIBRARY": ["nvidia/cuda_runtime/lib/libcudart.so.12", "nvidia/cu13/lib/libcudart.so.13"],
}


def point_at_pip_gpu_libraries(search_path: list[str]) -> None:
    """Names pip-installed NCCL and CUDA runtime libraries to the engine, which loads them when GPU tensors come.

    The loader's search path does not reach into site-packages; a variable the user
    set is left alone.
    """
    for variable, candidates in _PIP_GPU_LIBRARIES.items():
        if os.environ.get(variable):
            continue
        for folder in search_path:
            found = next((Path(folder) / c for c in candidates if (Path(folder) / c).is_file()), None)
            if found is not None:
                os.environ[variable] = str(found)
                break


def missing_gpu_kernels(info: dict, gpus: list) -> Optional[str]:
    """What to tell a user whose TensorFlow sees GPUs while our ops have CPU kernels only, else None.

    TensorFlow then places the collectives on the CPU and copies GPU tensors to the host and back:
    correct, but not the NCCL path.
    """
    if not gpus or info.get("gpu_kernels"):
        return None
    return (f"smdist_tf: TensorFlow sees {len(gpus)} GPU(s), but these smdist_tf ops have CPU kernels only, so "
            f"GPU tensors are copied to the host for every collective. Build the GPU variant "
            f"(`SMDIST_GPU=1 bash scripts/bootstrap.sh`, or a build with `-DSMDIST_GPU_KERNELS=ON` and the "
            f"`tensorflow` package) to reduce them on the GPU with NCCL.")


def load() -> tuple[ModuleType, ModuleType, dict]:
    """Checks the build and returns (runtime bindings, TF op module, build info)."""
    point_at_pip_gpu_libraries(sys.path)
    info = read_build_info()
    check_tensorflow_version(info["tensorflow_version"], tf.__version__)
    from smdist_tf import _runtime  # noqa: PLC0415 - after the version check on purpose

    ops = tf.load_op_library(str(_PACKAGE_DIR / "smdist_tf_ops.so"))
    message = missing_gpu_kernels(info, tf.config.list_physical_devices("GPU"))
    if message:
        warnings.warn(message, stacklevel=2)
    return _runtime, ops, info


runtime, op_module, build_info = load()
