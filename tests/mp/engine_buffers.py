"""Every rank: the engine's collectives on NumPy buffers, with TensorFlow impossible to import.

Run by tests/test_engine_without_tensorflow.py under mpirun. With an argument, the
runtime module is taken from that directory (a build configured with
``-DSMDIST_WITH_TENSORFLOW=OFF``); otherwise from the smdist_tf package.
Prints ``ENGINE-BUFFERS OK <rank>`` when every check passed.
"""

from __future__ import annotations

import sys

sys.modules["tensorflow"] = None  # any import of TensorFlow now fails

import numpy as np  # noqa: E402

from tests.runtime_module import load_runtime_module  # noqa: E402

if len(sys.argv) > 1:
    rt = load_runtime_module(sys.argv[1])
else:
    from smdist_tf import _runtime as rt  # noqa: E402

AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5  # smdist_tf/reduce_ops.py
DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64]


def rank_values(dtype, rank: int, shape=(3, 5)) -> np.ndarray:
    """Small values every rank can compute for any rank (products stay in range)."""
    rng = np.random.default_rng(100 + rank)
    low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -3
    return rng.integers(low, 4, size=shape).astype(dtype)


def expected(dtype, op: int, size: int, prescale: float, postscale: float) -> np.ndarray:
    # Integers are scaled in double and truncated toward zero on each rank, as the engine documents.
    stack = np.stack([rank_values(dtype, r).astype(np.float64) * prescale for r in range(size)])
    integer = not np.issubdtype(dtype, np.floating)
    if integer:
        stack = np.trunc(stack)
    out = {SUM: stack.sum(0), AVERAGE: stack.sum(0), MIN: stack.min(0), MAX: stack.max(0), PRODUCT: stack.prod(0)}[op]
    if op == AVERAGE:
        out = np.trunc(out / size) if integer else out / size
    out = out * postscale
    return np.trunc(out) if integer else out


def check_raises_everywhere(fn, text: str) -> None:
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        assert text in str(e), f"rank {rank}: {e}"
        return
    raise AssertionError(f"rank {rank}: no error (expected {text!r})")


rt.init()
rank, size = rt.rank(), rt.size()
for dtype in DTYPES:
    for op in (SUM, AVERAGE, MIN, MAX, PRODUCT):
        for prescale, postscale in ((1.0, 1.0), (2.0, 0.5)):
            if op in (MIN, MAX, PRODUCT) and prescale != 1.0:
                continue
            x = rank_values(dtype, rank)
            out = np.empty_like(x)
            rt._allreduce_buffer(x, out, f"ar.{np.dtype(dtype).name}.{op}.{prescale}", op, prescale, postscale)
            tol = 2e-2 if dtype == np.float16 else 1e-6
            np.testing.assert_allclose(out.astype(np.float64), expected(dtype, op, size, prescale, postscale),
                                       rtol=tol, atol=tol, err_msg=f"rank {rank}: {np.dtype(dtype).name} op {op}")
    # In place, from every root.
    for root in range(size):
        b = rank_values(dtype, rank)
        rt._broadcast_buffer(b, root, f"bc.{np.dtype(dtype).name}.{root}")
        np.testing.assert_array_equal(b, rank_values(dtype, root), err_msg=f"rank {rank}: broadcast from {root}")
flags = np.array([rank % 2 == 0, True])
rt._broadcast_buffer(flags, size - 1, "bc.bool")
assert flags.tolist() == [(size - 1) % 2 == 0, True], flags

# Errors reach every rank, and the engine carries on.
check_raises_everywhere(lambda: rt._allreduce_buffer(np.ones(2 + rank, np.float32), np.empty(2 + rank, np.float32),
                                                     "err.shape", SUM), "mismatched shapes")
check_raises_everywhere(lambda: rt._broadcast_buffer(np.ones(2), size, "err.root"), "out of range")
check_raises_everywhere(lambda: rt._allreduce_buffer(np.ones(2), np.ones(3), "err.local", SUM), "must match")
# Devices: ranks that disagree on CPU vs GPU, and a device no transport of this build reaches.
check_raises_everywhere(lambda: rt._allreduce_buffer(np.ones(2), np.empty(2), "err.devices", SUM,
                                                     device=0 if rank == 0 else -1), "mismatched devices")
# Here no GPU is usable: the tensors named GPU ones are staged through host memory, which
# fails on every rank naming the CUDA runtime (missing, or finding no device).
check_raises_everywhere(lambda: rt._allreduce_buffer(np.ones(2), np.empty(2), "err.gpu", SUM, device=0), "CUDA")
out = np.empty(4, np.float32)
rt._allreduce_buffer(np.ones(4, np.float32), out, "after.errors", SUM)
assert out.tolist() == [float(size)] * 4, out
assert "tensorflow" not in sys.modules or sys.modules["tensorflow"] is None
rt.shutdown()
print(f"ENGINE-BUFFERS OK {rank}", flush=True)
