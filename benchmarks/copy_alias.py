"""Copy speed by the destination's offset from the source, modulo 4 KiB.

On AMD Zen 3 (this project's 2-core development VM), ``rep movsb`` runs many times
slower when the destination lies a few bytes (measured: 4 to 28) past the source
modulo 4 KiB. glibc's memcpy uses it for blocks from a few KiB up to its
non-temporal threshold, and the kernel for every ``process_vm_readv``. The engine
routes its bulk copies through ``CopyBytes`` (``cc_ops/core/copy_bytes.h``) and
places cross-memory reads so neither case happens. This prints one JSON line per (copy, size, delta):

* ``memcpy``: ``numpy.copyto``, that is glibc's memcpy;
* ``copy_bytes``: the engine's ``CopyBytes`` (its vector loop in the slow window on AMD CPUs only);
* ``copy_bytes_vector_loop``: that loop, on any CPU;
* ``process_vm_readv``: the kernel's copy, reading this process's own memory.

Run: ``python benchmarks/copy_alias.py`` (one process, no MPI, a few seconds).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time
from typing import Callable

import numpy as np

SIZES = [16 << 10, 256 << 10, 1 << 20]
DELTAS = [0, 4, 16, 32, 64]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _kernel_copy() -> Callable[[np.ndarray, int, np.ndarray, int], None]:
    """process_vm_readv from this process into itself."""
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.getpid()

    def copy(dst: np.ndarray, at: int, src: np.ndarray, size: int) -> None:
        local = _IoVec(dst.ctypes.data + at, size)
        remote = _IoVec(src.ctypes.data, size)
        if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != size:
            raise OSError(ctypes.get_errno(), "process_vm_readv")

    return copy


def _time(fn: Callable[[], None], repeats: int) -> float:
    """Median seconds of one call, over `repeats` batches sized to take about 2 ms."""
    fn()
    start = time.perf_counter()
    fn()
    batch = max(1, int(0.002 / max(time.perf_counter() - start, 1e-7)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="batches timed per case (median reported)")
    args = parser.parse_args()

    from smdist_tf import _runtime  # the engine's copy; no TensorFlow import needed

    copies = {
        "memcpy": lambda dst, at, src, size: np.copyto(dst[at:at + size], src[:size]),
        "copy_bytes": lambda dst, at, src, size: _runtime._copy_bytes(dst, at, src, 0, size),
        "copy_bytes_vector_loop": lambda dst, at, src, size: _runtime._copy_bytes(dst, at, src, 0, size,
                                                                                  vector_loop=True),
        "process_vm_readv": _kernel_copy(),
    }
    for size in SIZES:
        src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
        dst = np.zeros(size + 8192, np.uint8)
        for name, copy in copies.items():
            base = None
            for delta in DELTAS:
                at = (src.ctypes.data - dst.ctypes.data + delta) % 4096  # dst = src + delta (mod 4 KiB)
                seconds = _time(lambda: copy(dst, at, src, size), args.repeat)
                if not np.array_equal(dst[at:at + size], src):
                    raise AssertionError(f"{name} copied wrongly at delta {delta}")
                base = seconds if delta == 0 else base
                print(json.dumps({"copy": name, "size_bytes": size, "delta": delta, "seconds": seconds,
                                  "GBps": size / seconds / 1e9, "vs_delta_0": seconds / base}), flush=True)


if __name__ == "__main__":
    main()
