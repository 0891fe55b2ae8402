"""The engine's device collectives on CuPy arrays, through the runtime module alone (no TensorFlow).

The GPU machine has CUDA, NCCL and CuPy but no TensorFlow, so the GPU data plane is
driven here by raw device pointers and a CUDA stream. ``load_runtime`` makes sure the
engine finds the CUDA runtime and NCCL that CuPy uses (already loaded, or from the
``nvidia-*`` pip packages) before the engine starts.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from tests.runtime_module import load_runtime_module

AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5  # smdist_tf/reduce_ops.py
FP16_WIRE = 1  # WireCompression::kFloat16


def load_runtime(runtime_dir: str | None = None) -> Any:
    """Imports CuPy (and its NCCL), points the engine at the same libraries, and returns the runtime module."""
    import cupy  # noqa: F401

    cupy.cuda.runtime.getDeviceCount()
    try:
        from cupy.cuda import nccl  # noqa: F401  - loads libnccl.so.2 into the process
    except ImportError:
        pass
    for variable, package, library in [("SMDIST_NCCL_LIBRARY", "nvidia.nccl", "lib/libnccl.so.2"),
                                       ("SMDIST_CUDA_RUNTIME_LIBRARY", "nvidia.cu13", "lib/libcudart.so.13")]:
        if os.environ.get(variable):
            continue
        try:
            module = importlib.import_module(package)
        except ImportError:
            continue
        for folder in module.__path__:
            if (Path(folder) / library).is_file():
                os.environ[variable] = str(Path(folder) / library)
    return load_runtime_module(runtime_dir or os.environ.get("SMDIST_RUNTIME_DIR"))


def storage_dtype(name: str) -> Any:
    """The NumPy/CuPy dtype that holds `name`'s elements (bfloat16 as its 16 bits)."""
    return np.uint16 if name == "bfloat16" else np.dtype(name)


def to_numpy(name: str, bits: np.ndarray) -> np.ndarray:
    """Host values of an array that holds `name` elements, as float64 for bfloat16."""
    if name == "bfloat16":
        import ml_dtypes

        return bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return bits


def from_numpy(name: str, values: np.ndarray) -> np.ndarray:
    """`values` as the storage of `name` elements."""
    if name == "bfloat16":
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16).view(np.uint16)
    return values.astype(name)


class DeviceCollectives:
    """Collectives on CuPy arrays of one GPU, queued on one stream."""

    def __init__(self, rt: Any, device: int, stream: Any):
        self.rt = rt
        self.device = device
        self.stream = stream
        self._keep: list[Any] = []  # outputs allocated for the engine, alive until read

    def _allocate(self, nbytes: int) -> int:
        import cupy

        with cupy.cuda.Device(self.device):
            buffer = cupy.empty(max(nbytes, 1), dtype=cupy.uint8)
        self._keep.append(buffer)
        return buffer.data.ptr

    def allreduce(self, inputs: list, outputs: list, dtype: str, names: list[str], op: int, **kw: Any) -> None:
        self.rt._allreduce_device([x.data.ptr for x in inputs], [y.data.ptr for y in outputs],
                                  [x.size for x in inputs], self.rt._dtype_codes[dtype], names, op,
                                  device=self.device, stream=self.stream.ptr, **kw)

    def allgather(self, x: Any, dtype: str, name: str, **kw: Any) -> Any:
        row = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
        self._keep.clear()
        rows = self.rt._allgather_device(x.data.ptr, x.shape[0], row, self.rt._dtype_codes[dtype], name,
                                         self._allocate, device=self.device, stream=self.stream.ptr, **kw)
        return self._keep[-1][: rows * row * x.itemsize].view(x.dtype).reshape((rows,) + x.shape[1:])

    def broadcast(self, x: Any, out: Any, dtype: str, root: int, name: str, **kw: Any) -> None:
        self.rt._broadcast_device(x.data.ptr, out.data.ptr, x.size, self.rt._dtype_codes[dtype], root, name,
                                  device=self.device, stream=self.stream.ptr, **kw)

    def alltoall(self, x: Any, splits: list[int], dtype: str, name: str, **kw: Any) -> tuple[Any, list[int]]:
        row = int(np.prod(x.shape[1:]))
        self._keep.clear()
        received = self.rt._alltoall_device(x.data.ptr, splits, row, self.rt._dtype_codes[dtype], name,
                                            self._allocate, device=self.device, stream=self.stream.ptr, **kw)
        rows = sum(received)
        return self._keep[-1][: rows * row * x.itemsize].view(x.dtype).reshape((rows,) + x.shape[1:]), received

    def reducescatter(self, x: Any, out: Any, dtype: str, name: str, op: int, **kw: Any) -> None:
        row = int(np.prod(x.shape[1:]))
        self.rt._reducescatter_device(x.data.ptr, out.data.ptr, x.shape[0], row, self.rt._dtype_codes[dtype], name,
                                      op, device=self.device, stream=self.stream.ptr, **kw)
