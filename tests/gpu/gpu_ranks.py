"""Every rank: the engine's collectives on CuPy arrays on a GPU, checked against local results.

Run under mpirun by tests/gpu/test_gpu_collectives.py (no TensorFlow needed). Modes:

* ``nccl``: NCCL carries the GPU tensors (one rank per GPU); the timeline must show it.
* ``staged``: ``SMDIST_GPU_OPERATIONS=MPI``: GPU tensors go through host memory, so
  several ranks can share one GPU; the timeline must show the host copies.
* ``refused``: ranks that share one GPU under NCCL: every rank gets the same error
  naming the problem, and the engine goes on.
* ``process_sets``: each rank in a process set of its own, sharing one GPU: every set
  gets its own NCCL communicator (of one rank, so NCCL accepts the shared GPU).
* ``hierarchical``: each rank says it is a host of its own (``SMDIST_HOSTNAME``) and
  ``SMDIST_GPU_HIERARCHICAL_ALLREDUCE=1``: allreduces go NCCL inside the host (one rank,
  so the GPU can be shared), MPI across hosts on host memory, NCCL back.

Prints ``GPU-RANKS OK <mode> <rank>`` when every check passed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.cupy_engine import (AVERAGE, FP16_WIRE, MAX, MIN, PRODUCT, SUM, DeviceCollectives,  # noqa: E402
                                   from_numpy, load_runtime, storage_dtype, to_numpy)
from tests.gpu.rank_checks import FLOATS, Checks, rank_values  # noqa: E402

MODE = sys.argv[1]
if MODE == "hierarchical":
    os.environ["SMDIST_HOSTNAME"] = f"host{os.environ['OMPI_COMM_WORLD_RANK']}"
    os.environ["SMDIST_GPU_HIERARCHICAL_ALLREDUCE"] = "1"
rt = load_runtime(sys.argv[2] if len(sys.argv) > 2 else None)
import cupy  # noqa: E402

rt.init()
rank, size = rt.rank(), rt.size()
device = rt.local_rank() if MODE == "multi_gpu" else 0
cupy.cuda.Device(device).use()
stream = cupy.cuda.Stream(non_blocking=True)
dc = DeviceCollectives(rt, device, stream)
REDUCED = ["uint8", "int8", "int16", "uint16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
checks = Checks()


def device_array(name: str, values: np.ndarray):
    with stream:
        return cupy.asarray(from_numpy(name, values))


def host(name: str, array) -> np.ndarray:
    stream.synchronize()
    return to_numpy(name, cupy.asnumpy(array))


def reduced(op: int, name: str, n: int) -> np.ndarray:
    stacked = np.stack([rank_values(r, n) for r in range(size)])
    if name not in FLOATS:  # integer arithmetic wraps as the element type does
        stacked = stacked.astype(np.int64)
    if op == SUM:
        out = stacked.sum(0)
    elif op == AVERAGE:
        out = stacked.sum(0) / size if name in FLOATS else stacked.sum(0) // size
    elif op == MIN:
        out = stacked.min(0)
    elif op == MAX:
        out = stacked.max(0)
    else:
        out = np.prod(stacked, axis=0)
    return out if name in FLOATS else out.astype(name).astype(np.int64)


def check_allreduce() -> None:
    n = 37
    for name in REDUCED:
        for op in (SUM, AVERAGE, MIN, MAX, PRODUCT):
            x = device_array(name, rank_values(rank, n))
            with stream:
                y = cupy.empty_like(x)
            dc.allreduce([x], [y], name, [f"ar.{name}.{op}"], op)
            checks.close(name, host(name, y), reduced(op, name, n), f"allreduce {name} op {op}")
        # In place: output is the input.
        x = device_array(name, rank_values(rank, n))
        dc.allreduce([x], [x], name, [f"ar.inplace.{name}"], SUM)
        checks.close(name, host(name, x), reduced(SUM, name, n), f"in-place allreduce {name}")
    for name in FLOATS:
        x = device_array(name, rank_values(rank, n))
        with stream:
            y = cupy.empty_like(x)
        dc.allreduce([x], [y], name, [f"ar.scaled.{name}"], SUM, prescale=0.5, postscale=3.0)
        checks.close(name, host(name, y), reduced(SUM, name, n) * 1.5, f"scaled sum {name}")
        dc.allreduce([x], [y], name, [f"ar.scaled_avg.{name}"], AVERAGE, postscale=2.0)
        checks.close(name, host(name, y), reduced(AVERAGE, name, n) * 2.0, f"scaled average {name}")


def check_fp16_wire_and_fusion() -> None:
    x = device_array("float32", rank_values(rank, 1000))
    with stream:
        y = cupy.empty_like(x)
    dc.allreduce([x], [y], "float32", ["ar.fp16wire"], SUM, compression=FP16_WIRE)
    checks.close("float16", host("float32", y), reduced(SUM, "float32", 1000), "fp16 on the wire")
    for name in ("float32", "float16", "int32"):
        counts = [1 + 7 * k for k in range(40)]
        xs = [device_array(name, rank_values(rank, c) + k % 3) for k, c in enumerate(counts)]
        with stream:
            ys = [cupy.empty_like(x) for x in xs]
        dc.allreduce(xs, ys, name, [f"fused.{name}.{k}" for k in range(len(xs))], SUM)
        for k, (c, y) in enumerate(zip(counts, ys)):
            checks.close(name, host(name, y), reduced(SUM, name, c) + size * (k % 3), f"fused {name} tensor {k}")


def check_allgather_broadcast_alltoall_reducescatter() -> None:
    for name in ("float32", "int64", "bfloat16", "bool", "uint16"):
        mine = (rank * 10 + np.arange((rank + 1) * 3)).reshape(rank + 1, 3) % (2 if name == "bool" else 1000)
        x = device_array(name, mine.astype(np.float64))
        got = host(name, dc.allgather(x, name, f"ag.{name}"))
        want = np.concatenate([((r * 10 + np.arange((r + 1) * 3)).reshape(r + 1, 3)) % (2 if name == "bool" else 1000)
                               for r in range(size)])
        checks.close(name, got, want.astype(np.float64), f"allgather {name}")
    root = size - 1
    for name in ("float64", "int8", "bfloat16"):
        x = device_array(name, rank_values(rank, 11))
        with stream:
            y = cupy.zeros_like(x)
        dc.broadcast(x, y, name, root, f"bc.{name}")
        checks.close(name, host(name, y), rank_values(root, 11), f"broadcast {name}")
        dc.broadcast(x, x, name, root, f"bc.inplace.{name}")
        checks.close(name, host(name, x), rank_values(root, 11), f"in-place broadcast {name}")
    splits = [1 + (rank + j) % 3 for j in range(size)]
    rows = [np.array([[rank * 100 + j * 10 + k, -k] for k in range(s)], np.float64).reshape(s, 2)
            for j, s in enumerate(splits)]
    for name in ("float32", "int32"):
        x = device_array(name, np.concatenate(rows))
        got, received = dc.alltoall(x, splits, name, f"a2a.{name}")
        want = np.concatenate([np.array([[j * 100 + rank * 10 + k, -k] for k in range(1 + (j + rank) % 3)],
                                        np.float64).reshape(-1, 2) for j in range(size)])
        if received != [1 + (j + rank) % 3 for j in range(size)]:
            raise AssertionError(f"alltoall received splits {received}")
        checks.close(name, host(name, got), want, f"alltoall {name}")
    total_rows = 2 * size + 1
    start = sum(total_rows // size + (r < total_rows % size) for r in range(rank))
    mine_rows = total_rows // size + (rank < total_rows % size)
    for name, op in (("float32", SUM), ("float32", AVERAGE), ("int32", MAX), ("float16", SUM)):
        x = device_array(name, rank_values(rank, total_rows * 3).reshape(total_rows, 3))
        with stream:
            y = cupy.zeros((mine_rows, 3), dtype=storage_dtype(name))
        dc.reducescatter(x, y, name, f"rs.{name}.{op}", op)
        want = reduced(op, name, total_rows * 3).reshape(total_rows, 3)[start:start + mine_rows]
        checks.close(name, host(name, y), want, f"reducescatter {name} op {op}")


def check_refused() -> None:
    x = device_array("float32", rank_values(rank, 8))
    try:
        dc.allreduce([x], [x], "float32", ["ar.shared_gpu"], SUM)
    except RuntimeError as err:
        if "share one GPU" not in str(err):
            raise
    else:
        raise AssertionError("two ranks on one GPU under NCCL did not fail")
    out = np.empty(4, np.float32)
    rt._allreduce_buffer(np.ones(4, np.float32), out, "host.after.refusal", SUM)
    assert out.tolist() == [float(size)] * 4, out


def check_process_sets() -> None:
    set_ids = [rt.add_process_set([r]) for r in range(size)]
    mine = set_ids[rank]
    x = device_array("float32", rank_values(rank, 16))
    with stream:
        y = cupy.empty_like(x)
    dc.allreduce([x], [y], "float32", ["ps.sum"], SUM, process_set_id=mine)
    checks.close("float32", host("float32", y), rank_values(rank, 16), "allreduce in a set of one")
    dc.allreduce([x], [y], "float32", ["ps.avg"], AVERAGE, postscale=2.0, process_set_id=mine)
    checks.close("float32", host("float32", y), rank_values(rank, 16) * 2, "scaled average in a set of one")
    got = dc.allgather(x.reshape(4, 4), "float32", "ps.allgather", process_set_id=mine)
    checks.close("float32", host("float32", got).ravel(), rank_values(rank, 16), "allgather in a set of one")
    with stream:
        y = cupy.zeros_like(x)
    dc.broadcast(x, y, "float32", rank, "ps.broadcast", process_set_id=mine)  # roots are job ranks
    checks.close("float32", host("float32", y), rank_values(rank, 16), "broadcast in a set of one")
    for set_id in set_ids:
        rt.remove_process_set(set_id)


if MODE == "refused":
    check_refused()
elif MODE == "process_sets":
    check_process_sets()
elif MODE == "hierarchical":
    if rt.cross_size() != size:
        raise AssertionError(f"expected {size} hosts of one rank, got cross_size {rt.cross_size()}")
    check_allreduce()
    check_fp16_wire_and_fusion()
else:
    if MODE in ("nccl", "multi_gpu") and not rt.nccl_built():
        raise AssertionError("NCCL mode, but the engine cannot load NCCL")
    check_allreduce()
    check_fp16_wire_and_fusion()
    check_allgather_broadcast_alltoall_reducescatter()
rt.shutdown()

timeline = os.environ.get("SMDIST_TIMELINE")
if timeline and MODE != "refused" and (rank == 0 or MODE == "process_sets"):
    text = Path(timeline.replace("{rank}", str(rank))).read_text()
    if MODE == "staged":
        assert '"path":"nccl"' not in text and "MEMCPY_IN_HOST_BUFFER" in text, "GPU tensors were not staged"
    elif MODE == "hierarchical":
        assert '"path":"nccl_hierarchical"' in text, "no allreduce ran hierarchically"
    else:
        assert '"path":"nccl"' in text, "no allreduce ran over NCCL"
print(json.dumps({"mode": MODE, "rank": rank, "size": size, "checks": checks.count}), flush=True)
print(f"GPU-RANKS OK {MODE} {rank}", flush=True)
