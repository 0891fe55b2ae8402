"""Two disjoint process sets at once against a job of their size alone, through the engine alone.

The same figure as ``benchmarks/allreduce.py --process-set`` (issue #23: each 2-rank set of a
4-rank job, both allreducing at the same time, against a 2-rank job alone), measured on
NumPy buffers through the runtime module (``_allreduce_buffer``) instead of TensorFlow ops,
so it runs where TensorFlow is missing (the lent GPU machine, whose 16 cores give the four
ranks a core each; on 2 cores the sets can only share the cores and the figure says nothing).

    python benchmarks/process_sets_engine.py [--sizes 1M,16M,64M] [--repeat 3] [--runtime-dir DIR]
    python benchmarks/allreduce.py --process-set --engine-only [same options]

Each repeat runs the 2-rank job, then the 4-rank job (the plain 4-rank allreduce, then the
sets [0, 1] and [2, 3] together); JSON lines, the last with ``"summary": true``: per size,
each set's busbw over the 2-rank job's (medians over repeats). Nothing here asserts speed.
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
sys.path.insert(0, str(ROOT))  # the loader of the engine's binding, in tests/
from engine_only import mpirun, parse_sizes, run_job, worker_or_driver  # noqa: E402
from tests.runtime_module import load_runtime_module  # noqa: E402

SUM, MAX = 1, 4
SETS = [[0, 1], [2, 3]]



def load_runtime(runtime_dir: str | None):
    sys.modules["tensorflow"] = None  # the engine alone
    return load_runtime_module(runtime_dir)


def worker(args: argparse.Namespace) -> None:
    rt = load_runtime(args.runtime_dir)
    rt.init()
    rank, n = rt.rank(), rt.size()

    def barrier() -> None:
        rt._allreduce_buffer(np.zeros(1), np.empty(1), "bench.barrier", SUM)

    def slowest(seconds: list[float]) -> list[float]:
        """Every slot's maximum over the ranks (each rank fills its own slots)."""
        out = np.empty(len(seconds))
        rt._allreduce_buffer(np.array(seconds), out, f"bench.slowest.{len(seconds)}", MAX)
        return out.tolist()

    set_ids = [rt.add_process_set(ranks) for ranks in SETS] if args.worker == "sets" else []
    for size in args.sizes:
        x, out = np.ones(size // 4, np.float32), np.empty(size // 4, np.float32)
        iters = max(5, min(200, (256 << 20) // size))
        cases = [("alone" if n == 2 else "global", 0, n)]
        if set_ids:
            mine = 0 if rank in SETS[0] else 1
            cases.append((f"set{mine}", set_ids[mine], 2))
        for case, set_id, members in cases:
            name = f"bench.{case}.{size}"
            for _ in range(3):
                rt._allreduce_buffer(x, out, name, SUM, process_set_id=set_id)
            barrier()
            start = time.perf_counter()
            for _ in range(iters):
                rt._allreduce_buffer(x, out, name, SUM, process_set_id=set_id)
            secs = (time.perf_counter() - start) / iters
            if out[0] != members:
                raise SystemExit(f"{case}: wrong sum {out[0]} (want {members})")
            if case.startswith("set"):
                per_set = [0.0, 0.0]
                per_set[int(case[-1])] = secs
                times = slowest(per_set)
                labels = [("set0", 2), ("set1", 2)]
            else:
                times, labels = slowest([secs]), [(case, members)]
            if rank == 0:
                for (label, m), t in zip(labels, times):
                    print(json.dumps({"case": label, "np": m, "job_np": n, "size_bytes": size, "seconds": t,
                                      "iters": iters, "busbw_GBps": size / t * 2 * (m - 1) / m / 1e9}), flush=True)
    for set_id in set_ids:
        rt.remove_process_set(set_id)
    rt.shutdown()


def drive(args: argparse.Namespace) -> int:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    records, failed = [], 0
    for rep in range(args.repeat):
        for worker_case, np_ in (("alone", 2), ("sets", 4)):
            cmd = [mpirun(), "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable, __file__,
                   "--worker", worker_case, "--sizes", ",".join(map(str, args.sizes))]
            if args.runtime_dir:
                cmd += ["--runtime-dir", args.runtime_dir]
            got = run_job(cmd, ROOT, env, {"worker": worker_case}, rep)
            failed += got is None
            records += got or []

    def median(case: str, size: int) -> float | None:
        bw = [r["busbw_GBps"] for r in records if r["case"] == case and r["size_bytes"] == size]
        return statistics.median(bw) if bw else None

    summary = {"summary": True, "cpus": os.cpu_count()}
    for size in args.sizes:
        alone, plain = median("alone", size), median("global", size)
        summary[str(size)] = {f"{s}_over_alone": (median(s, size) / alone if alone and median(s, size) else None)
                              for s in ("set0", "set1")}
        summary[str(size)]["global_busbw_GBps"] = plain
        summary[str(size)]["alone_busbw_GBps"] = alone
    print(json.dumps(summary), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=parse_sizes,
                        default=[1 << 20, 16 << 20, 64 << 20])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runtime-dir", help="where _runtime*.so is (default: smdist_tf/)")
    parser.add_argument("--worker", choices=["alone", "sets"])
    return worker_or_driver(parser.parse_args(argv), worker, drive)


if __name__ == "__main__":
    sys.exit(main())
