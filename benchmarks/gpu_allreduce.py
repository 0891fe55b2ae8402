"""GPU allreduce: smdist_tf's engine over NCCL against raw NCCL, and the host-staged path, one run.

Run as ``python benchmarks/allreduce.py --device gpu [--sizes 1M,16M,64M,256M] [--repeat 2]``
(or this file directly). Needs CuPy and a GPU, not TensorFlow: the engine is driven through
its runtime module on CuPy arrays (tests/gpu/cupy_engine.py). Each case is one ``mpirun``
job; cases alternate within each repeat so ratios compare the same minutes:

* ``nccl_raw``: ``ncclAllReduce`` through CuPy's NCCL binding on one stream.
* ``smdist_nccl``: the same tensors through the engine (negotiation, then NCCL on the stream).
* ``smdist_staged``: ``SMDIST_GPU_OPERATIONS=MPI``: device -> host, the CPU allreduce, host -> device.
* ``smdist_xla``: the same allreduce compiled by JAX's XLA into our custom call, whose CUDA handler
  (cc_ops/xla) queues it on XLA's stream (tests/gpu/jax_engine.py); skipped where JAX has no GPU.
* ``jax_floor``: a jitted elementwise op of the same size (``x * 2``) and no collective: what any one
  jitted call costs JAX and the GPU here, the floor under ``smdist_xla``.

On a machine with one GPU every NCCL case runs at one rank (NCCL refuses two ranks on one
GPU), where an allreduce moves no bytes between ranks: busbw is 0 and the figure that
compares is time (``algbw_GBps``: bytes / time). The staged case also runs at 2 ranks sharing
the GPU. JSON lines; the last has ``"summary": true`` with smdist_nccl / nccl_raw and
smdist_xla / nccl_raw and jax_floor / smdist_xla per size. Every rank runs rank 0's iteration count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from engine_only import mpirun, parse_sizes, run_job, worker_or_driver  # noqa: E402

SUM = 1



def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.gpu.cupy_engine import DeviceCollectives, load_runtime

    rt = load_runtime(args.runtime_dir)
    import cupy
    from cupy.cuda import nccl

    n = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    cupy.cuda.Device(0).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    if args.worker == "nccl_raw":
        comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    elif args.worker == "jax_floor":
        pass  # no engine: one process, nothing to agree on
    else:
        rt.init()
        dc = DeviceCollectives(rt, 0, stream)
    if args.worker in ("smdist_xla", "jax_floor"):
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax

        from tests.gpu import jax_engine
        if args.worker == "smdist_xla":
            jax_engine.register_handlers()
        try:
            jax_gpu = jax.devices("gpu")[0]
        except RuntimeError as err:
            print(json.dumps({"system": args.worker, "skipped": f"JAX has no GPU: {err}"}), flush=True)
            if args.worker == "smdist_xla":
                rt.shutdown()
            return
    for size in args.sizes:
        count = size // 4
        with stream:
            x = cupy.ones(count, dtype=cupy.float32)
            y = cupy.empty_like(x)
        synchronize = stream.synchronize
        if args.worker == "nccl_raw":
            def once() -> None:
                comm.allReduce(x.data.ptr, y.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        elif args.worker in ("smdist_xla", "jax_floor"):
            xla_x = jax.device_put(np.ones(count, np.float32), jax_gpu)
            if args.worker == "smdist_xla":
                call = jax_engine.jitted(jax_engine.ALLREDUCE, [((count,), np.float32)], f"bench.xla.{size}")
            else:
                call = jax.jit(lambda v: [v * 2.0])
            xla_out = [xla_x]

            def once() -> None:
                xla_out[0] = call(xla_x)[0]  # dispatched; XLA's stream orders the calls

            def synchronize() -> None:  # noqa: F811 - this case waits on XLA's result, not CuPy's stream
                xla_out[0].block_until_ready()
        else:
            def once() -> None:
                dc.allreduce([x], [y], "float32", [f"bench.{size}"], SUM)
        for _ in range(3):
            once()
        synchronize()
        # Calibrate: ten calls say how many fill --seconds. Rank 0 decides and every rank follows,
        # so all run the same count (a loop ended by each rank's own clock can hang the job).
        start = time.perf_counter()
        for _ in range(10):
            once()
        synchronize()
        per_call = (time.perf_counter() - start) / 10
        iters = int(min(2000, max(3, args.seconds / max(per_call, 1e-9))))
        if args.worker not in ("nccl_raw", "jax_floor"):
            agreed = np.array([iters], np.int64)
            rt._broadcast_buffer(agreed, 0, f"bench.iterations.{size}", 0)
            iters = int(agreed[0])
        start = time.perf_counter()
        for i in range(iters):
            once()
            if (i + 1) % 50 == 0:
                synchronize()
        synchronize()
        secs = (time.perf_counter() - start) / iters
        if args.worker in ("smdist_xla", "jax_floor"):
            y = cupy.asarray(np.asarray(xla_out[0]))
        want = 2.0 if args.worker == "jax_floor" else float(n)
        if float(y[:1].get()[0]) != want:
            raise SystemExit(f"{args.worker}: wrong result {y[:1].get()[0]} (want {want})")
        if rank == 0:
            algbw = size / secs / 1e9
            print(json.dumps({"system": args.worker, "np": n, "size_bytes": size, "seconds": secs, "iters": iters,
                              "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n}), flush=True)
    if args.worker not in ("nccl_raw", "jax_floor"):
        rt.shutdown()


def drive(args: argparse.Namespace) -> int:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cases = [("nccl_raw", 1, {}), ("smdist_nccl", 1, {}), ("smdist_staged", 1, {"SMDIST_GPU_OPERATIONS": "MPI"}),
             ("smdist_staged", 2, {"SMDIST_GPU_OPERATIONS": "MPI"}), ("smdist_xla", 1, {}), ("jax_floor", 1, {})]
    sizes = ",".join(str(s) for s in args.sizes)
    records, failed = [], 0
    for rep in range(args.repeat):
        for system, np_, extra in cases:
            cmd = [mpirun(), "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable, __file__,
                   "--worker", system, "--sizes", sizes, "--seconds", str(args.seconds)]
            if args.runtime_dir:
                cmd += ["--runtime-dir", args.runtime_dir]
            got = run_job(cmd, ROOT, {**env, **extra}, {"system": system, "np": np_}, rep)
            failed += got is None
            records += got or []

    def median(system: str, np_: int, size: int) -> float | None:
        times = [r["seconds"] for r in records
                 if r.get("system") == system and r.get("np") == np_ and r.get("size_bytes") == size]
        return statistics.median(times) if times else None

    summary = {"summary": True, "device": "gpu"}
    for size in args.sizes:
        raw, ours, staged = median("nccl_raw", 1, size), median("smdist_nccl", 1, size), median("smdist_staged", 1, size)
        xla, floor = median("smdist_xla", 1, size), median("jax_floor", 1, size)
        summary[str(size)] = {
            "smdist_nccl_over_raw": raw / ours if raw and ours else None,
            "smdist_staged_over_raw": raw / staged if raw and staged else None,
            "smdist_xla_over_raw": raw / xla if raw and xla else None,
            "raw_us": raw and raw * 1e6, "smdist_nccl_us": ours and ours * 1e6, "smdist_staged_us": staged and staged * 1e6,
            "smdist_xla_us": xla and xla * 1e6, "jax_floor_us": floor and floor * 1e6,
            "jax_floor_over_smdist_xla": floor / xla if floor and xla else None,
        }
    print(json.dumps(summary), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["gpu"], default="gpu")
    parser.add_argument("--sizes", type=parse_sizes,
                        default=[1 << 20, 16 << 20, 64 << 20, 256 << 20])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.3, help="timed seconds per size and case")
    parser.add_argument("--runtime-dir", help="where _runtime*.so is (default: smdist_tf/)")
    parser.add_argument("--worker", choices=["nccl_raw", "smdist_nccl", "smdist_staged", "smdist_xla", "jax_floor"])
    return worker_or_driver(parser.parse_args(argv), worker, drive)


if __name__ == "__main__":
    sys.exit(main())
