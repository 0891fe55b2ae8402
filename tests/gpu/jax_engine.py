"""The collectives' XLA handlers (cc_ops/xla, libsmdist_xla.so) driven through JAX's XLA runtime.

JAX compiles each call with ``jax.jit`` into one ``smdist_collective`` custom call, the one
TensorFlow's lowerings emit, with the same attributes (cc_ops/xla/collective_call.h); XLA runs
the handler registered for its platform ("cpu": host buffers; "CUDA": device buffers on XLA's
stream). No TensorFlow: the engine is started through the runtime module, which shares the
engine library with libsmdist_xla.so.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tests.runtime_module import PACKAGE_DIR, load_runtime_module

TARGET = "smdist_collective"
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER = 0, 1, 2, 3, 4  # CollectiveType
HANDLERS = {"cpu": "smdist_xla_collective_host", "CUDA": "smdist_xla_collective_cuda"}


def runtime_dir() -> str:
    return os.environ.get("SMDIST_RUNTIME_DIR", str(PACKAGE_DIR))


def load_runtime(platform: str) -> Any:
    """The runtime module; on the GPU, after pointing the engine at CuPy's CUDA runtime and NCCL."""
    if platform == "gpu":
        from tests.gpu.cupy_engine import load_runtime as load_with_cupy

        return load_with_cupy(runtime_dir())
    return load_runtime_module(runtime_dir())


def register_handlers() -> None:
    """Registers both handlers of libsmdist_xla.so with JAX's XLA."""
    import jax

    library = ctypes.CDLL(str(Path(runtime_dir()) / "libsmdist_xla.so"))
    for platform, symbol in HANDLERS.items():
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(getattr(library, symbol)), platform=platform)


def jitted(kind: int, results: Sequence[tuple[tuple[int, ...], Any]], name: str, *, process_set_id: int = 0,
           reduce_op: int = 1, prescale: float = 1.0, postscale: float = 1.0, compression: int = 0,
           root_rank: int = 0) -> Any:
    """A jitted function of one smdist_collective call, returning its results ((shape, dtype) each)."""
    import jax

    # No side effect declared: each call is a jit of its own whose results are used, so XLA can neither drop
    # nor merge it, and JAX keeps its C++ dispatch (a side-effecting jit takes the Python path: +85 us a
    # call on the H200, against 37 us with the handler's own time included). TensorFlow's lowering declares
    # one (cc_ops/tf/xla_collective_kernels.cc): a graph may hold collectives whose results go unread.
    call = jax.ffi.ffi_call(TARGET, [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in results])
    attributes = dict(type=np.int64(kind), name=name, process_set_id=np.int64(process_set_id),
                      reduce_op=np.int64(reduce_op), prescale=np.float64(prescale), postscale=np.float64(postscale),
                      compression=np.int64(compression), root_rank=np.int64(root_rank))
    return jax.jit(lambda *operands: call(*operands, **attributes))


def collective(kind: int, xs: Sequence[Any], results: Sequence[tuple[tuple[int, ...], Any]], name: str,
               **kw: Any) -> list[Any]:
    """One smdist_collective call over `xs`, compiled and run."""
    return list(jitted(kind, results, name, **kw)(*xs))


def allreduce(xs: Sequence[Any], name: str, op: int, **kw: Any) -> list[Any]:
    """Allreduce of one tensor, or of a group in one call (names "name.i", fused)."""
    return collective(ALLREDUCE, xs, [(x.shape, x.dtype) for x in xs], name, reduce_op=op, **kw)


def allgather(x: Any, name: str, size: int, **kw: Any) -> Any:
    return collective(ALLGATHER, [x], [((x.shape[0] * size,) + x.shape[1:], x.dtype)], name, **kw)[0]


def broadcast(x: Any, name: str, root: int, **kw: Any) -> Any:
    return collective(BROADCAST, [x], [(x.shape, x.dtype)], name, root_rank=root, **kw)[0]


def alltoall(x: Any, name: str, **kw: Any) -> Any:
    return collective(ALLTOALL, [x], [(x.shape, x.dtype)], name, **kw)[0]


def reducescatter(x: Any, name: str, rows: int, op: int, **kw: Any) -> Any:
    return collective(REDUCESCATTER, [x], [((rows,) + x.shape[1:], x.dtype)], name, reduce_op=op, **kw)[0]
