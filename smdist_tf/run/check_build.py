"""``smdistrun --check-build``: what this smdist_tf was built with and can use."""

from __future__ import annotations

import os
import sys

from smdist_tf.run.errors import UsageError
from smdist_tf.run.mpi_command import detect_flavour, find_mpirun


def _mark(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def check_build_report() -> str:
    """The report text. Importing smdist_tf here checks the native build and TensorFlow version."""
    import tensorflow as tf  # noqa: PLC0415 - only this command needs it

    import smdist_tf as sd  # noqa: PLC0415

    info = sd.get_build_info()
    try:
        mpirun = find_mpirun(os.environ)
        flavour = detect_flavour(mpirun)
        mpirun_line = f"{mpirun} ({flavour.name} {flavour.version})"
    except UsageError as e:
        mpirun_line = f"not usable: {e}"
    lines = [
        f"smdist_tf {sd.__version__}",
        "",
        "Framework:",
        f"    {_mark(True)} TensorFlow {tf.__version__} (built against {info.get('tensorflow_version')})",
        "",
        "Controllers:",
        f"    {_mark(sd.mpi_built())} MPI ({info.get('mpi_flavour')}, mpicxx {info.get('mpicxx')})",
        f"    {_mark(sd.gloo_built())} Gloo",
        "",
        "Tensor operations:",
        f"    {_mark(sd.nccl_built())} NCCL",
        f"    {_mark(sd.cuda_built())} CUDA",
        f"    {_mark(sd.mpi_built())} MPI (CPU collectives)",
        "",
        f"mpirun: {mpirun_line}",
    ]
    return "\n".join(lines)


def print_check_build() -> int:
    """Prints the report; returns the exit code (1 if smdist_tf cannot be loaded)."""
    try:
        print(check_build_report())
    except ImportError as e:
        print(f"smdistrun: smdist_tf cannot be loaded: {e}", file=sys.stderr)
        return 1
    return 0
