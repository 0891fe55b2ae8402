"""Prints the kernels a built ``smdist_tf_ops.so`` registers for our ops; fails if a collective lacks a GPU one.

Usage: ``python scripts/gpu_kernel_listing.py OUT_DIR`` (the ``SMDIST_OUTPUT_DIR`` of
a ``-DSMDIST_GPU_KERNELS=ON`` build), run by the Python of a CUDA build of TensorFlow
(``SMDIST_GPU=1 bash scripts/bootstrap.sh`` runs it). Needs no GPU: it loads the library and reads
TensorFlow's kernel registry; nothing runs on a device.

The collective ops are the ``REGISTER_OP`` names in cc_ops/tf/collective_ops.cc,
so a new op is checked without touching this file. Exit status: 0 when every one
has a GPU and a CPU kernel, 1 otherwise.

The registry is read through ``tensorflow.python.framework.kernels``, a
TensorFlow internal: it is used here, outside the ``smdist_tf`` package, and
only by this check (tests/test_tensorflow_package.py runs it in CI).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collective_ops() -> list[str]:
    return re.findall(r'REGISTER_OP\("(\w+)"\)', (ROOT / "cc_ops" / "tf" / "collective_ops.cc").read_text())


def main(out_dir: Path) -> int:
    import tensorflow as tf
    from tensorflow.python.framework import kernels  # TensorFlow internal: see the docstring

    library = out_dir.resolve() / "smdist_tf_ops.so"
    tf.load_op_library(str(library))
    print(f"registered kernels in {library} (TensorFlow {tf.__version__}, "
          f"CUDA build: {tf.sysconfig.get_build_info().get('is_cuda_build')})")
    missing = []
    for op in collective_ops():
        registered = kernels.get_registered_kernels_for_op(op).kernel
        devices = sorted(k.device_type for k in registered)
        for kernel in registered:
            print(str(kernel).strip())
            print("-")
        if "GPU" not in devices or "CPU" not in devices:
            missing.append(f"{op} ({', '.join(devices) or 'no kernels'})")
    if missing:
        print("FAIL: no GPU and CPU kernel for " + "; ".join(missing))
        return 1
    print(f"OK: a GPU and a CPU kernel for each of the {len(collective_ops())} collective ops")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} OUT_DIR")
    sys.exit(main(Path(sys.argv[1])))
