"""Every rank: the collectives compiled by JAX's XLA into smdist_collective custom calls, against NumPy.

Run under mpirun by tests/gpu/test_xla_collectives.py (no TensorFlow needed). Modes:

* ``cpu``: JAX's CPU backend, host buffers (the "Host" handler), at any number of ranks.
* ``nccl``: JAX on the GPU, one rank: the "CUDA" handler queues NCCL on XLA's stream.
* ``staged``: JAX on the GPU, ranks sharing it, ``SMDIST_GPU_OPERATIONS=MPI``: the
  "CUDA" handler takes the host-staged path.

Prints ``XLA-RANKS OK <mode> <rank>`` when every check passed. A rank still running after
``XLA_RANKS_STACKS_AFTER`` seconds prints its threads' stacks, so a hang shows where.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

MODE = sys.argv[1]
faulthandler.dump_traceback_later(float(os.environ.get("XLA_RANKS_STACKS_AFTER", "150")), exit=False)
os.environ["JAX_PLATFORMS"] = "cpu" if MODE == "cpu" else "cuda"
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # ranks may share one GPU
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu import jax_engine as xc  # noqa: E402
from tests.gpu.rank_checks import FLOATS, Checks, rank_values  # noqa: E402

rt = xc.load_runtime("cpu" if MODE == "cpu" else "gpu")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_x64", True)
xc.register_handlers()
rt.init()
rank, size = rt.rank(), rt.size()
AVERAGE, SUM, MIN, MAX = 0, 1, 3, 4
REDUCED = ["uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]  # NCCL's types
checks = Checks()


def device_array(name: str, values: np.ndarray):
    return jax.device_put(jnp.asarray(values.astype(np.float64)).astype(name))


def host(array) -> np.ndarray:
    return np.asarray(jnp.asarray(array).astype(jnp.float64))


def reduced(op: int, name: str, values: list[np.ndarray]) -> np.ndarray:
    stacked = np.stack(values)
    out = {SUM: stacked.sum(0), MIN: stacked.min(0), MAX: stacked.max(0)}.get(op)
    if op == AVERAGE:
        out = stacked.sum(0) / len(values) if name in FLOATS else stacked.sum(0) // len(values)
    return out


def check_allreduce() -> None:
    n = 37
    everyone = [rank_values(r, n) for r in range(size)]
    for name in REDUCED:
        for op in (SUM, AVERAGE, MIN, MAX):
            got = xc.allreduce([device_array(name, rank_values(rank, n))], f"ar.{name}.{op}", op)[0]
            checks.close(name, host(got), reduced(op, name, everyone), f"allreduce {name} op {op}")
    for name in FLOATS:
        x = device_array(name, rank_values(rank, n))
        got = xc.allreduce([x], f"ar.scaled.{name}", SUM, prescale=0.5, postscale=3.0)[0]
        checks.close(name, host(got), reduced(SUM, name, everyone) * 1.5, f"scaled sum {name}")
    got = xc.allreduce([device_array("float32", rank_values(rank, 1000))], "ar.fp16wire", SUM, compression=1)[0]
    checks.close("float16", host(got), reduced(SUM, "float32", [rank_values(r, 1000) for r in range(size)]),
                 "fp16 compression")


def check_grouped_allreduce() -> None:
    counts = [3, 17, 1, 64, 9]
    xs = [device_array("float32", rank_values(rank, c) + k) for k, c in enumerate(counts)]
    outs = xc.allreduce(xs, "grouped", SUM)
    for k, (c, y) in enumerate(zip(counts, outs)):
        checks.close("float32", host(y), reduced(SUM, "float32", [rank_values(r, c) for r in range(size)]) + size * k,
                     f"grouped tensor {k}")


def check_other_collectives() -> None:
    for name in ("float32", "int64", "bfloat16", "uint8"):
        mine = (rank * 10 + np.arange(6)).reshape(2, 3)
        got = xc.allgather(device_array(name, mine), f"ag.{name}", size)
        want = np.concatenate([(r * 10 + np.arange(6)).reshape(2, 3) for r in range(size)])
        checks.close(name, host(got), want, f"allgather {name}")
    root = size - 1
    for name in ("float64", "int8", "float16"):
        got = xc.broadcast(device_array(name, rank_values(rank, 11)), f"bc.{name}", root)
        checks.close(name, host(got), rank_values(root, 11), f"broadcast {name}")
    # Equal splits: block j (2 rows) goes to rank j.
    for name in ("float32", "int32"):
        blocks = [np.array([[rank * 100 + j * 10 + k, -k] for k in range(2)], np.float64) for j in range(size)]
        got = xc.alltoall(device_array(name, np.concatenate(blocks)), f"a2a.{name}")
        want = np.concatenate([np.array([[j * 100 + rank * 10 + k, -k] for k in range(2)]) for j in range(size)])
        checks.close(name, host(got), want, f"alltoall {name}")
    total_rows = 2 * size + 1
    start = sum(total_rows // size + (r < total_rows % size) for r in range(rank))
    rows = total_rows // size + (rank < total_rows % size)
    for name, op in (("float32", SUM), ("float32", AVERAGE), ("int32", MAX), ("float16", SUM)):
        x = device_array(name, rank_values(rank, total_rows * 3).reshape(total_rows, 3))
        got = xc.reducescatter(x, f"rs.{name}.{op}", rows, op)
        everyone = [rank_values(r, total_rows * 3).reshape(total_rows, 3) for r in range(size)]
        checks.close(name, host(got), reduced(op, name, everyone)[start:start + rows], f"reducescatter {name} {op}")


def check_process_sets() -> None:
    """Ranks of one parity form a set: its collectives reach only its members (from 2 ranks on)."""
    if size < 2:
        return
    ids = [rt.add_process_set([r for r in range(size) if r % 2 == parity]) for parity in (0, 1) if parity < size]
    members = [r for r in range(size) if r % 2 == rank % 2]
    mine = ids[rank % 2]
    got = xc.allreduce([device_array("float32", rank_values(rank, 16))], "ps.sum", SUM, process_set_id=mine)[0]
    checks.close("float32", host(got), reduced(SUM, "float32", [rank_values(r, 16) for r in members]), "set sum")
    got = xc.allgather(device_array("float32", rank_values(rank, 8).reshape(2, 4)), "ps.ag", len(members),
                       process_set_id=mine)
    checks.close("float32", host(got), np.concatenate([rank_values(r, 8).reshape(2, 4) for r in members]), "set ag")
    got = xc.broadcast(device_array("float32", rank_values(rank, 5)), "ps.bc", members[-1], process_set_id=mine)
    checks.close("float32", host(got), rank_values(members[-1], 5), "set broadcast (a job rank as root)")
    for set_id in ids:
        rt.remove_process_set(set_id)


def expect_error_on_this_rank(call, words: str, what: str) -> None:
    try:
        jax.block_until_ready(call())
    except Exception as err:  # XLA's runtime error type differs across JAX versions
        if words not in str(err):
            raise AssertionError(f"{what}: the error does not say '{words}': {err}") from err
        checks.count += 1
    else:
        raise AssertionError(f"{what}: no error on rank {rank}")


def check_errors() -> None:
    if size > 1:  # a shape of each rank's own: negotiation refuses it on every rank
        expect_error_on_this_rank(
            lambda: xc.allreduce([device_array("float32", rank_values(rank, 4 + rank))], "err.shape", SUM),
            "shape", "mismatched shapes")
        rows = size + 1  # never divides evenly by size > 1
        expect_error_on_this_rank(lambda: xc.alltoall(device_array("float32", np.zeros((rows, 2))), "err.a2a"),
                                  "divide evenly", "uneven alltoall under XLA")
    # The engine goes on after errors.
    got = xc.allreduce([device_array("float32", rank_values(rank, 4))], "after.errors", SUM)[0]
    checks.close("float32", host(got), reduced(SUM, "float32", [rank_values(r, 4) for r in range(size)]),
                 "allreduce after errors")


def check_timeline(text: str) -> None:
    """The grouped call is one allreduce of all its tensors, on the path the mode names."""
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r'"tid":(\d+),"args":\{"name":"([^"]+)"\}', text)}
    events = [(rows.get(int(m.group(1))), m.group(2)) for m in
              re.finditer(r'\{"name":"ALLREDUCE","ph":"X","pid":\d+,"tid":(\d+),[^}]*"args":\{([^}]*)\}', text)]
    grouped = [args for row, args in events if row and row.startswith("grouped.")]
    if len(grouped) != 5 or not all('"fused":5' in args for args in grouped):
        raise AssertionError(f"the grouped call was not one fused allreduce of 5 tensors: {grouped}")
    if MODE == "nccl" and not all('"path":"nccl"' in args for args in grouped):
        raise AssertionError(f"the grouped call did not run over NCCL: {grouped}")
    if MODE == "staged" and "MEMCPY_IN_HOST_BUFFER" not in text:
        raise AssertionError("GPU buffers were not staged through the host")


check_allreduce()
check_grouped_allreduce()
check_other_collectives()
check_process_sets()
check_errors()
rt.shutdown()
timeline = os.environ.get("SMDIST_TIMELINE")
if timeline and rank == 0:
    check_timeline(Path(timeline.replace("{rank}", str(rank))).read_text())
faulthandler.cancel_dump_traceback_later()
print(json.dumps({"mode": MODE, "rank": rank, "size": size, "checks": checks.count, "jax": jax.__version__,
                  "device": str(jax.devices()[0])}), flush=True)
# The handlers need no TensorFlow (tests/runtime_module.py says how a stray import of it once came about).
assert "tensorflow" not in sys.modules, "a rank driving the XLA handlers through JAX imported TensorFlow"
print(f"XLA-RANKS OK {MODE} {rank}", flush=True)
