"""Allreduce benchmark: smdist_tf against raw MPI_Allreduce and TF's MultiWorkerMirroredStrategy.

Run the driver, which launches ``mpirun`` itself (one job per phase) and prints JSON lines::

    python benchmarks/allreduce.py --np 2            # full run
    python benchmarks/allreduce.py --np 4 --quick    # smoke run
    python benchmarks/allreduce.py --process-set --sizes 64K,1M,16M --dtypes float32
    python benchmarks/allreduce.py --device gpu      # GPU: NCCL through the engine vs raw (gpu_allreduce.py)
    python benchmarks/allreduce.py --process-set --engine-only   # the same case without TensorFlow

Phases (each its own ``mpirun`` job, because a MultiWorkerMirroredStrategy must be built before
any other TensorFlow op runs in its process):

* ``core``: for each size, raw ``MPI_Allreduce`` through mpi4py (with the smdist engine shut
  down, so its thread does not share the cores), then smdist_tf eager / ``tf.function``
  allreduce (Sum; Adasum beside it at power-of-two rank counts) and fp16 and int8 compression, back to back
  so each ratio compares the same minute; then
  the ResNet-50-like gradient step, MPI and smdist_tf fused and unfused.
* ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy`` over loopback gRPC.
* ``memcpy``: a local numpy copy in the driver process, as the machine's memory reference.

``--process-set`` runs a case of its own instead: a 2-rank job alone (``pset_alone``), then a
4-rank job (``pset_sets``) in which the process sets [0, 1] and [2, 3] run the eager allreduce
at the same time, each within its set, and the same job's plain 4-rank allreduce; the summary
gives each set's busbw as a fraction of the 2-rank job's and of the 4-rank job's. With ``--engine-only``
the case runs on NumPy buffers through the engine alone (``process_sets_engine.py``; ``--sizes``,
``--repeat``, ``--runtime-dir``), where TensorFlow is missing: the 16-core GPU machine gives each of the
four ranks a core, which the 2-core VM cannot.

Every output line is one JSON object; the last one has ``"summary": true`` and the ratios the
targets of issue #3 are judged by. Nothing here asserts performance.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder's modules, also when imported
# `--device gpu` runs where TensorFlow may be missing (the GPU machine): its own module,
# before anything imports smdist_tf.
if __name__ == "__main__" and "--device" in sys.argv[1:]:
    from gpu_allreduce import main as gpu_main

    sys.exit(gpu_main(sys.argv[1:]))
# `--process-set --engine-only`: the same case on NumPy buffers through the engine alone.
if __name__ == "__main__" and {"--process-set", "--engine-only"} <= set(sys.argv[1:]):
    from process_sets_engine import main as engine_main

    sys.exit(engine_main([a for a in sys.argv[1:] if a not in ("--process-set", "--engine-only")]))

from engine_only import parse_sizes  # noqa: E402
from smdist_tf.run.session_dir import BASE_VARIABLE, private_session_base  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FULL_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 1 << 20]
DTYPES = ["float32", "float16", "bfloat16"]
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
ALL_SYSTEMS = ["smdist_tf", "mpi", "mwms", "memcpy"]
MIB = 1 << 20
# ResNet-50 tensors below this (BN gamma/beta, the dense bias: 109 of 161) make the latency-bound list.
SMALL_TENSOR_BYTES = 64 << 10
# A step of many tiny tensors, more than the response cache holds (1024): per-tensor cost only.
MANY_SMALL_COUNT, MANY_SMALL_BYTES = 2048, 1 << 10


# ----------------------------------------------------------------------------- shared helpers



def resnet50_shapes() -> list[tuple[int, ...]]:
    """Trainable-variable shapes of a ResNet-50 (conv kernels without bias, BN gamma/beta, dense).

    Returns:
        161 shapes totalling about 25.6 M elements, in layer order.
    """
    shapes: list[tuple[int, ...]] = [(7, 7, 3, 64), (64,), (64,)]
    cin = 64
    for blocks, mid, out in [(3, 64, 256), (4, 128, 512), (6, 256, 1024), (3, 512, 2048)]:
        for b in range(blocks):
            if b == 0:  # projection shortcut
                shapes += [(1, 1, cin, out), (out,), (out,)]
            shapes += [(1, 1, cin, mid), (mid,), (mid,), (3, 3, mid, mid), (mid,), (mid,),
                       (1, 1, mid, out), (out,), (out,)]
            cin = out
    shapes += [(2048, 1000), (1000,)]
    return shapes


def record(system: str, case: str, size: int, dtype: str, np_: int, seconds: Optional[float],
           iters: int = 0, **extra: Any) -> dict:
    """Builds one result line; bandwidths are derived from ``size`` bytes and ``seconds``.

    Args:
        system: ``smdist_tf``, ``mpi``, ``mwms`` or ``memcpy`` (plus a variant suffix).
        case: what was reduced, e.g. ``single``, ``resnet50_grads``.
        size: logical bytes reduced per call (the uncompressed tensor size).
        dtype: element type of the user's tensor.
        np_: number of ranks.
        seconds: median seconds per call (max over ranks), or None when not measured.
        iters: calls timed in total.
        **extra: further keys (notes, wire bytes...).

    Returns:
        The JSON-ready dict.
    """
    algbw = size / seconds if seconds else None
    # busbw normalises for the ring's 2(n-1)/n traffic; a local copy has no such factor.
    factor = 1.0 if system == "memcpy" else 2.0 * (np_ - 1) / np_
    busbw = algbw * factor if algbw is not None else None
    rec = {"system": system, "case": case, "size_bytes": size, "dtype": dtype, "np": np_,
           "seconds": seconds, "algbw": algbw, "busbw": busbw,
           "algbw_GBps": None if algbw is None else round(algbw / 1e9, 4),
           "busbw_GBps": None if busbw is None else round(busbw / 1e9, 4), "iters": iters}
    rec.update(extra)
    return rec


def emit(rec: dict) -> None:
    """Prints one JSON line at once (rank 0 only calls this)."""
    print(json.dumps(rec), flush=True)


class Timer:
    """Times a callable the same way on every rank: warm-up, calibrate, then repetitions.

    Each repetition starts from a barrier and runs ``inner`` back-to-back calls, so small
    sizes measure latency without the barrier in it; the median repetition per call is taken
    and the slowest rank's median reported.
    """

    def __init__(self, comm: Any, reps: int, warmup: int = 3, min_rep_s: float = 0.02, max_inner: int = 200,
                 result_comm: Any = None):
        self.comm, self.reps, self.warmup = comm, reps, warmup
        # The ranks whose slowest median is reported (default: ``comm``). Barriers and the loop
        # length stay on ``comm``, so groups timed apart on it start together and loop as long.
        self.result_comm = result_comm if result_comm is not None else comm
        self.min_rep_s, self.max_inner = min_rep_s, max_inner
        self.last: dict[str, float] = {}

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, int]:
        """Times ``fn``.

        Args:
            fn: one collective call; must be called the same number of times on every rank.

        Returns:
            (median seconds per call, slowest rank; total timed calls).
        """
        from mpi4py import MPI

        # The warm-up calls double as calibration: the first (tracing, first negotiation) is
        # ignored and the best of the rest sets the loop length, so a stray slow call cannot.
        calls = []
        for _ in range(max(self.warmup, 2)):
            self.comm.Barrier()
            t0 = time.perf_counter()
            fn()
            calls.append(time.perf_counter() - t0)
        one = self.comm.allreduce(min(calls[1:]), op=MPI.MAX)  # ranks must agree on the loop length
        inner = int(min(self.max_inner, max(1, self.min_rep_s / max(one, 1e-9))))
        samples = []
        for _ in range(self.reps):
            self.comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
        # Best and worst repetitions too: on a shared machine the spread says how far to trust the median.
        out = self.result_comm
        self.last = {"seconds_min": out.allreduce(min(samples), op=MPI.MAX),
                     "seconds_max": out.allreduce(max(samples), op=MPI.MAX)}
        return out.allreduce(statistics.median(samples), op=MPI.MAX), inner * self.reps


# ----------------------------------------------------------------------------- MPI (mpi4py)


def _f16_sum(inbuf: Any, outbuf: Any, datatype: Any) -> None:
    """MPI user op: float16 sum (numpy computes it in float32 and rounds)."""
    import numpy as np

    out = np.frombuffer(outbuf, dtype=np.float16)
    out += np.frombuffer(inbuf, dtype=np.float16)


def _bf16_sum(inbuf: Any, outbuf: Any, datatype: Any) -> None:
    """MPI user op: bfloat16 sum via float32, rounded to nearest even."""
    import numpy as np

    a = np.frombuffer(inbuf, dtype=np.uint16).astype(np.uint32) << 16
    out = np.frombuffer(outbuf, dtype=np.uint16)
    s = (a.view(np.float32) + (out.astype(np.uint32) << 16).view(np.float32)).view(np.uint32)
    out[:] = ((s + 0x7FFF + ((s >> 16) & 1)) >> 16).astype(np.uint16)


def _mpi_ops() -> dict:
    """MPI datatype and op per dtype name; fp16/bf16 have no MPI type: a Python user op on
    2-byte elements (slow, but a real sum)."""
    from mpi4py import MPI

    return {"float32": (MPI.FLOAT, MPI.SUM), "float16": (MPI.UINT16_T, MPI.Op.Create(_f16_sum, commute=True)),
            "bfloat16": (MPI.UINT16_T, MPI.Op.Create(_bf16_sum, commute=True))}


def _mpi_buffer(count: int, dtype: Any) -> Any:
    """A zeroed numpy array of ``count`` elements in its own anonymous mapping, advised onto huge pages.

    MPI's single-copy transfers pin the pages they touch, so its speed depends on whether a
    buffer sits on huge pages, which for plain numpy arrays depends on the process's allocation
    history (a fresh mmap, or heap memory freed by earlier cases). A mapping of its own gives
    the baseline its best case every time, whatever ran before it.
    """
    import mmap

    import numpy as np

    nbytes = max(1, count * np.dtype(dtype).itemsize)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(region, dtype=dtype, count=count)  # zero-filled by the kernel


def run_mpi_size(comm: Any, timer: Timer, ops: dict, dtype: str, size: int) -> None:
    """Raw MPI_Allreduce on a numpy buffer of ``size`` bytes: in place, and out of place from 1 MiB."""
    import numpy as np
    from mpi4py import MPI

    n, rank = comm.Get_size(), comm.Get_rank()
    mpi_type, op = ops[dtype]
    # Zeros: in-place sums stay finite however many iterations run.
    buf = _mpi_buffer(size // ITEMSIZE[dtype], np.float32 if dtype == "float32" else np.uint16)
    secs, iters = timer(lambda: comm.Allreduce(MPI.IN_PLACE, [buf, mpi_type], op=op))
    if rank == 0:
        note = {} if dtype == "float32" else {"note": "python user-defined MPI_Op (no native type)"}
        emit(record("mpi", "single", size, dtype, n, secs, iters, **note, **timer.last))
    if dtype == "float32" and size >= MIB:
        # What a TensorFlow op must do: an eager op cannot overwrite its input, so it writes a
        # new output. Reference only; the targets compare with the in-place call above.
        out = _mpi_buffer(buf.size, buf.dtype)
        secs, iters = timer(lambda: comm.Allreduce([buf, mpi_type], [out, mpi_type], op=op))
        if rank == 0:
            emit(record("mpi", "single_out_of_place", size, dtype, n, secs, iters, **timer.last))


def run_mpi_resnet(comm: Any, timer: Timer) -> None:
    """Raw MPI_Allreduce of the ResNet-50 gradient list: one call per tensor, and one flat buffer."""
    import numpy as np
    from mpi4py import MPI

    n, rank = comm.Get_size(), comm.Get_rank()
    shapes = resnet50_shapes()
    bufs = [_mpi_buffer(int(np.prod(s)), np.float32) for s in shapes]
    total = sum(b.nbytes for b in bufs)

    def loop() -> None:
        for b in bufs:
            comm.Allreduce(MPI.IN_PLACE, [b, MPI.FLOAT], op=MPI.SUM)

    small = [b for b in bufs if b.nbytes < SMALL_TENSOR_BYTES]

    def small_loop() -> None:
        for b in small:
            comm.Allreduce(MPI.IN_PLACE, [b, MPI.FLOAT], op=MPI.SUM)

    many = [_mpi_buffer(MANY_SMALL_BYTES // 4, np.float32) for _ in range(MANY_SMALL_COUNT)]

    def many_loop() -> None:
        for b in many:
            comm.Allreduce(MPI.IN_PLACE, [b, MPI.FLOAT], op=MPI.SUM)

    flat = _mpi_buffer(total // 4, np.float32)
    for case, fn, size, tensors in [
            ("resnet50_grads_loop", loop, total, len(bufs)),
            ("resnet50_grads_flat", lambda: comm.Allreduce(MPI.IN_PLACE, [flat, MPI.FLOAT], op=MPI.SUM), total, 1),
            ("resnet50_small_grads_loop", small_loop, sum(b.nbytes for b in small), len(small)),
            ("many_small_loop", many_loop, MANY_SMALL_COUNT * MANY_SMALL_BYTES, MANY_SMALL_COUNT)]:
        secs, iters = timer(fn)
        if rank == 0:
            emit(record("mpi", case, size, "float32", n, secs, iters, tensors=tensors, **timer.last))


# ----------------------------------------------------------------------------- smdist_tf


def _tf_dtype(name: str) -> Any:
    """The tf.DType for a dtype name used on the command line."""
    import tensorflow as tf

    return {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}[name]


def _restart_engine(fusion_threshold: Optional[str]) -> None:
    """Restarts the smdist engine with SMDIST_FUSION_THRESHOLD set (or unset for the default)."""
    import smdist_tf as sd

    if fusion_threshold is None:
        os.environ.pop("SMDIST_FUSION_THRESHOLD", None)
    else:
        os.environ["SMDIST_FUSION_THRESHOLD"] = fusion_threshold
    if sd.is_initialized():
        sd.shutdown()
    sd.init()


def _chained_allreduce(x: Any, count: int, name: str) -> Callable[[], Any]:
    """A tf.function running ``count`` dependent allreduces of ``x`` (no eager dispatch per op)."""
    import tensorflow as tf

    import smdist_tf as sd

    @tf.function(autograph=False)  # a plain Python loop: nothing for AutoGraph to convert
    def chained() -> Any:
        t = x
        for i in range(count):
            # Sum, as the MPI baseline: across hosts an Average costs one more pass over the result.
            t = sd.allreduce(t, op=sd.Sum, name=f"{name}.graph{i}")
        return t

    return chained


def _stop_engine() -> None:
    """Shuts the smdist engine down, if smdist_tf is loaded and running, so MPI has the cores."""
    sd = sys.modules.get("smdist_tf")
    if sd is not None and sd.is_initialized():
        sd.shutdown()


def run_smdist_size(args: argparse.Namespace, timer: Timer, dtype: str, size: int) -> None:
    """smdist_tf on one tensor of ``size`` bytes: eager, in a ``tf.function`` chain, fp16- and int8-compressed."""
    import tensorflow as tf

    import smdist_tf as sd

    n, rank = sd.size(), sd.rank()
    # Allreduces per tf.function call; the per-call cost is divided by it. All but the first run in
    # place (each consumes the last one's result), as gradient allreduces in a training step do.
    graph_loop = 8
    x = tf.fill([size // ITEMSIZE[dtype]], tf.constant(0.5, _tf_dtype(dtype)))
    name = f"bench.{dtype}.{size}"
    secs, iters = timer(lambda: sd.allreduce(x, op=sd.Sum, name=name))
    if rank == 0:
        emit(record("smdist_tf", "single", size, dtype, n, secs, iters, mode="eager", **timer.last))
    if n & (n - 1) == 0:  # Adasum combines a power-of-two number of ranks
        # Beside Sum at the same size: its halving steps, dot products and allgather (docs/api.md#adasum).
        secs, iters = timer(lambda: sd.allreduce(x, op=sd.Adasum, name=name + ".adasum"))
        if rank == 0:
            emit(record("smdist_tf", "adasum", size, dtype, n, secs, iters, mode="eager", **timer.last))
    if dtype == "float32" and size == min(args.sizes):
        # Unnamed eager calls: each is a new collective (numbered), negotiated in full.
        secs, iters = timer(lambda: sd.allreduce(x, op=sd.Sum))
        if rank == 0:
            emit(record("smdist_tf", "single_unnamed", size, dtype, n, secs, iters, mode="eager",
                        **timer.last))
    if dtype == "float32":
        # Engine cost without per-op eager dispatch: a chain of allreduces in one graph.
        secs, iters = timer(_chained_allreduce(x, graph_loop, name))
        if rank == 0:
            per_op = {k: v / graph_loop for k, v in timer.last.items()}
            emit(record("smdist_tf_graph", "single", size, dtype, n, secs / graph_loop, iters * graph_loop,
                        mode="tf.function", allreduces_per_call=graph_loop, **per_op))
        secs, iters = timer(lambda: sd.allreduce(x, op=sd.Sum, compression=sd.Compression.fp16,
                                                 name=name + ".c16"))
        if rank == 0:
            emit(record("smdist_tf", "fp16_compression", size, dtype, n, secs, iters, mode="eager",
                        wire_dtype="float16", wire_bytes=size // 2, **timer.last))
        secs, iters = timer(lambda: sd.allreduce(x, op=sd.Sum, compression=sd.Compression.int8,
                                                 name=name + ".c8"))
        if rank == 0:
            # One byte per element and a float32 scale per block of 256 (docs/compression.md).
            elements = size // ITEMSIZE[dtype]
            emit(record("smdist_tf", "int8_compression", size, dtype, n, secs, iters, mode="eager",
                        wire_dtype="int8", wire_bytes=elements + 4 * -(-elements // 256), **timer.last))


def run_smdist_resnet(comm: Any, timer: Timer) -> None:
    """smdist_tf on the ResNet-50 gradient list: fused, unfused, eager loop, per tensor in a graph."""
    import tensorflow as tf

    import smdist_tf as sd

    n, rank = comm.Get_size(), comm.Get_rank()
    grads = [tf.fill(list(s), 0.5) for s in resnet50_shapes()]
    total = sum(int(g.shape.num_elements()) * 4 for g in grads)

    def eager_loop() -> None:
        for i, g in enumerate(grads):
            sd.allreduce(g, op=sd.Average, name=f"rn.{i}")

    @tf.function(autograph=False)
    def graph_per_tensor() -> Any:
        # Horovod-style: one allreduce per gradient inside the step's tf.function; the engine fuses
        # whatever is in flight together.
        return [sd.allreduce(g, op=sd.Average, name=f"rn.graph.{i}") for i, g in enumerate(grads)]

    # The latency-bound part of the step: what fusion saves is per-tensor cost, not bytes.
    small = [g for g in grads if int(g.shape.num_elements()) * 4 < SMALL_TENSOR_BYTES]
    small_total = sum(int(g.shape.num_elements()) * 4 for g in small)

    def small_group() -> Any:
        return sd.grouped_allreduce(small, op=sd.Average, name="rn.small")

    many = [tf.fill([MANY_SMALL_BYTES // 4], 0.5) for _ in range(MANY_SMALL_COUNT)]

    def many_group() -> Any:
        return sd.grouped_allreduce(many, op=sd.Sum, name="many")

    def group() -> Any:
        return sd.grouped_allreduce(grads, op=sd.Average, name="rn.group")

    many_total = MANY_SMALL_COUNT * MANY_SMALL_BYTES
    cases = [("resnet50_grads_fused", None, group, grads, total),
             ("resnet50_grads_unfused", "0", group, grads, total),
             ("resnet50_grads_eager_loop", None, eager_loop, grads, total),
             ("resnet50_grads_graph_per_tensor", None, graph_per_tensor, grads, total),
             ("resnet50_small_grads_fused", None, small_group, small, small_total),
             ("resnet50_small_grads_unfused", "0", small_group, small, small_total),
             ("many_small_fused", None, many_group, many, many_total),
             ("many_small_unfused", "0", many_group, many, many_total)]
    for case, threshold, fn, tensors, size in cases:
        _restart_engine(threshold)
        secs, iters = timer(fn)
        if rank == 0:
            emit(record("smdist_tf", case, size, "float32", n, secs, iters, tensors=len(tensors),
                        fusion_threshold_bytes=sd.engine_config()["fusion_threshold_bytes"], **timer.last))


def worker_core(args: argparse.Namespace) -> None:
    """The ``core`` phase under mpirun: per size, raw MPI then smdist_tf; then the ResNet-50 lists.

    Each size's MPI and smdist_tf cases run back to back, so the ratios between them compare the
    same minute of this VM, whose speed drifts. MPI runs with the smdist engine shut down: its
    thread, idle or not, must not share the cores with the baseline.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    timer = Timer(comm, args.iters)
    mpi, smdist = "mpi" in args.systems, "smdist_tf" in args.systems
    config = None
    if smdist:
        import tensorflow  # noqa: F401  (imported before any timing, as both sides then run beside it)

        import smdist_tf as sd

        user_threshold = os.environ.get("SMDIST_FUSION_THRESHOLD")
        threshold = user_threshold if user_threshold not in (None, "0") else None
    ops = _mpi_ops() if mpi else {}
    for dtype in args.dtypes:
        for size in args.sizes:
            if mpi:
                _stop_engine()
                run_mpi_size(comm, timer, ops, dtype, size)
            if smdist:
                if not sd.is_initialized():  # MPI's cases above shut it down
                    _restart_engine(threshold)
                config = config or sd.engine_config()
                run_smdist_size(args, timer, dtype, size)
    if mpi:
        _stop_engine()
        run_mpi_resnet(comm, timer)
    if smdist:
        run_smdist_resnet(comm, timer)
    if comm.Get_rank() == 0 and config is not None:
        emit({"system": "smdist_tf", "case": "engine_config", "np": comm.Get_size(), "config": config})


# ----------------------------------------------------------------------------- process sets


PSET_GROUPS = ([0, 1], [2, 3])  # the two disjoint sets of the 4-rank job
PSET_JOB_NP, PSET_ALONE_NP = 4, 2


def worker_pset_alone(args: argparse.Namespace) -> None:
    """``pset_alone``: a 2-rank job's eager ``Sum`` allreduce per size, the sets' baseline."""
    from mpi4py import MPI

    import smdist_tf as sd

    comm = MPI.COMM_WORLD
    timer = Timer(comm, args.iters)
    sd.init()
    for size in args.sizes:
        x = _tf_fill(size)
        secs, iters = timer(lambda: sd.allreduce(x, op=sd.Sum, name=f"pset.alone.{size}"))
        if comm.Get_rank() == 0:
            emit(record("smdist_tf", "process_set_baseline", size, "float32", comm.Get_size(), secs, iters,
                        mode="eager", job_np=comm.Get_size(), **timer.last))
    sd.shutdown()


def worker_pset_sets(args: argparse.Namespace) -> None:
    """``pset_sets``: per size, a plain 4-rank allreduce, then both sets' allreduces at once.

    The plain allreduce runs with an engine that has no sets (no idle set threads beside it);
    the engine is restarted with the two sets before they are timed. Both sets start each
    repetition from a barrier of the whole job and loop the same number of calls, so their
    loops overlap; each set's figure is its slowest member's median.
    """
    from mpi4py import MPI

    import smdist_tf as sd

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    if n != PSET_JOB_NP:
        raise SystemExit(f"the process-set case needs {PSET_JOB_NP} ranks, got {n}")
    index = next(i for i, ranks in enumerate(PSET_GROUPS) if rank in ranks)
    set_comm = comm.Split(color=index, key=rank)
    plain_timer, set_timer = Timer(comm, args.iters), Timer(comm, args.iters, result_comm=set_comm)
    for size in args.sizes:
        x = _tf_fill(size)
        # shutdown() stops the engine on every rank: wait until no rank is still timing.
        comm.Barrier()
        if sd.is_initialized():
            sd.shutdown()
        sd.init()
        secs, iters = plain_timer(lambda: sd.allreduce(x, op=sd.Sum, name=f"pset.global.{size}"))
        if rank == 0:
            emit(record("smdist_tf", "process_set_global", size, "float32", n, secs, iters, mode="eager",
                        job_np=n, **plain_timer.last))
        comm.Barrier()
        sd.shutdown()
        sets = [sd.ProcessSet(ranks) for ranks in PSET_GROUPS]
        sd.init(process_sets=sets)
        mine = sets[index]
        secs, iters = set_timer(lambda: sd.allreduce(x, op=sd.Sum, name=f"pset.set.{size}", process_set=mine))
        results = comm.gather((index, secs, iters, dict(set_timer.last)), root=0)
        if rank == 0:
            for i, s_secs, s_iters, last in sorted({r[0]: r for r in results}.values()):
                emit(record("smdist_tf", "process_set_concurrent", size, "float32", len(PSET_GROUPS[i]), s_secs,
                            s_iters, mode="eager", job_np=n, process_set=PSET_GROUPS[i],
                            concurrent_sets=[list(g) for g in PSET_GROUPS], **last))
    comm.Barrier()  # the other set may still be timing
    sd.shutdown()
    set_comm.Free()


def _tf_fill(size: int) -> Any:
    """A float32 tensor of ``size`` bytes."""
    import tensorflow as tf

    return tf.fill([size // 4], tf.constant(0.5, tf.float32))


def measure_pset_ratios(records: list[dict], args: argparse.Namespace) -> dict:
    """The process-set figures from one run's lines: {field: {set: {size: ratio}}}."""
    vs_alone: dict[str, dict] = {}
    vs_global: dict[str, dict] = {}
    best_alone: dict[str, dict] = {}
    for ranks in PSET_GROUPS:
        key = ",".join(map(str, ranks))
        vs_alone[key], vs_global[key], best_alone[key] = {}, {}, {}
        for s in args.sizes:
            mine = next((r for r in records if r.get("case") == "process_set_concurrent" and r.get("size_bytes") == s
                         and r.get("process_set") == ranks and r.get("seconds")), None)
            alone = _find(records, "smdist_tf", "process_set_baseline", s)
            plain = _find(records, "smdist_tf", "process_set_global", s)
            vs_alone[key][str(s)] = _ratio(mine and mine["busbw"], alone and alone["busbw"])
            vs_global[key][str(s)] = _ratio(mine and mine["busbw"], plain and plain["busbw"])
            # From each side's best repetition (both are 2-rank busbw): steadier on a loaded machine.
            best_alone[key][str(s)] = _ratio(alone and alone.get("seconds_min"), mine and mine.get("seconds_min"))
    return {"busbw_ratio_set_vs_2rank_job_alone": vs_alone, "busbw_ratio_set_vs_4rank_job_global": vs_global,
            "busbw_ratio_set_vs_2rank_job_alone_best_rep": best_alone}


def _drive_process_sets(args: argparse.Namespace) -> int:
    """``--process-set``: the 2-rank job, then the 4-rank job with two sets, ``--repeat`` times."""
    load: dict[str, Any] = {"start": list(os.getloadavg())}
    records: list[dict] = []
    errors: list[str] = []
    per_repeat: list[dict] = []
    for rep in range(args.repeat):
        tag = rep if args.repeat > 1 else None
        run_records: list[dict] = []
        for phase, np_ in (("pset_alone", PSET_ALONE_NP), ("pset_sets", PSET_JOB_NP)):
            recs, err = run_phase(phase, args, tag, np_=np_)
            run_records += recs
            if err:
                errors.append(err)
        records += run_records
        figures = measure_pset_ratios(run_records, args)
        per_repeat.append(figures)
        if args.repeat > 1:
            emit({"repeat_summary": rep, "process_set": True, **figures})

    def median_nested(key: str) -> dict:
        return {ps: {s: (round(statistics.median(v), 4) if (v := [f[key][ps][s] for f in per_repeat
                                                                   if f[key][ps][s] is not None]) else None)
                     for s in per_repeat[0][key][ps]} for ps in per_repeat[0][key]}

    figures = {key: median_nested(key) for key in per_repeat[0]}
    ratios = [v for by_size in figures["busbw_ratio_set_vs_2rank_job_alone"].values() for v in by_size.values()
              if v is not None]
    emit({"summary": True, "process_set": True, "np": PSET_JOB_NP, "sets": [list(g) for g in PSET_GROUPS],
          "baseline_np": PSET_ALONE_NP, "sizes": args.sizes, "repeats": args.repeat, **figures,
          "min_busbw_ratio_set_vs_2rank_job": min(ratios) if ratios else None,
          "target_each_set_ge_0.9x_2rank_job": (min(ratios) >= 0.9) if ratios else None,
          "cpu_count": os.cpu_count(),
          "note": (f"{PSET_JOB_NP} ranks on {os.cpu_count()} CPUs" if (os.cpu_count() or 0) < PSET_JOB_NP * 2
                   else None),
          "load_average": {"start": load["start"], "end": list(os.getloadavg())},
          "smdist_library_mtime_utc": _library_mtime(), "errors": errors})
    return 1 if errors else 0


# ----------------------------------------------------------------------------- MultiWorkerMirroredStrategy


def worker_mwms(args: argparse.Namespace) -> None:
    """The ``mwms`` phase: TF's own collective all-reduce (ring over gRPC on loopback)."""
    import socket

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    ports = None
    if rank == 0:  # all ranks are on this host, so rank 0 can pick every port
        socks = [socket.socket() for _ in range(n)]
        for s in socks:
            s.bind(("localhost", 0))
        ports = [s.getsockname()[1] for s in socks]
        for s in socks:
            s.close()
    ports = comm.bcast(ports, root=0)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    import tensorflow as tf

    comm_opts = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm_opts)
    timer = Timer(comm, args.iters)

    def make_step(tensors: list) -> Callable[[], Any]:
        @tf.function
        def step() -> Any:
            def replica_fn() -> Any:
                ctx = tf.distribute.get_replica_context()
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tensors)
            return strategy.run(replica_fn)

        return step

    with strategy.scope():
        for size in args.sizes:
            x = tf.fill([size // 4], 0.5)
            secs, iters = timer(make_step([x]))
            if rank == 0:
                emit(record("mwms", "single", size, "float32", n, secs, iters, implementation="RING", **timer.last))
        grads = [tf.fill(list(s), 0.5) for s in resnet50_shapes()]
        total = sum(int(g.shape.num_elements()) * 4 for g in grads)
        secs, iters = timer(make_step(grads))
        if rank == 0:
            emit(record("mwms", "resnet50_grads", total, "float32", n, secs, iters, tensors=len(grads), **timer.last))
    comm.Barrier()
    sys.stdout.flush()
    MPI.Finalize()  # mpirun counts a rank that exits without finalize as failed
    os._exit(0)  # the strategy's gRPC server can keep the process alive at exit


# ----------------------------------------------------------------------------- driver


def measure_memcpy(np_: int, reps: int) -> dict:
    """Local numpy copy of 64 MiB: the machine's memory bandwidth reference."""
    import numpy as np

    src = np.ones(64 * MIB // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    samples = []
    for _ in range(max(reps, 10)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - t0)
    return record("memcpy", "local_copy", src.nbytes, "float32", np_, statistics.median(samples), len(samples),
                  note="bytes copied per second (read + write of the buffer counted once)")


# Forwarded to the ranks on the second (namespace) host, which do not inherit the driver's environment.
_FORWARDED_ENV = ("PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "TF_CPP_MIN_LOG_LEVEL", "LD_LIBRARY_PATH",
                  "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def mpirun_cmd(np_: int, hosts: Optional[dict] = None, env: Optional[dict] = None) -> list[str]:
    """The mpirun next to this Python (the venv's Open MPI), else the one on PATH.

    With ``hosts`` (from ``netns_hosts.two_namespace_hosts``), half the ranks run on each namespace
    host and talk TCP over the veth pair; the names in ``_FORWARDED_ENV`` that ``env`` sets are
    forwarded to them.
    """
    local = Path(sys.executable).parent / "mpirun"
    exe = str(local) if local.exists() else (shutil.which("mpirun") or "mpirun")
    cmd = [exe, "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    if hosts is None:
        return cmd
    per_host = (np_ + 1) // 2
    cmd = [*hosts["launch_prefix"], *cmd, "-H", f"{hosts['ip_a']}:{per_host},{hosts['ip_b']}:{per_host}",
           "--map-by", "node", "--prtemca", "plm_ssh_agent", hosts["agent"]]
    source = env if env is not None else os.environ
    for name in [*_FORWARDED_ENV, *sorted(n for n in source if n.startswith(("SMDIST_", "HOROVOD_")))]:
        if name in source:
            cmd += ["-x", name]
    return cmd


def run_phase(phase: str, args: argparse.Namespace, repeat: Optional[int] = None,
              np_: Optional[int] = None) -> tuple[list[dict], Optional[str]]:
    """Runs one worker phase under mpirun; returns its JSON records and an error text if it failed.

    Records are tagged with ``repeat`` when given; ``np_`` overrides ``args.np``. Non-JSON output is passed through to stderr. The
    whole process group is killed on timeout.
    """
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", phase, "--iters", str(args.iters),
            "--sizes", ",".join(str(s) for s in args.sizes), "--dtypes", ",".join(args.dtypes),
            "--systems", ",".join(args.systems)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    records: list[dict] = []
    deadline = time.monotonic() + args.timeout
    error = None
    # A private session directory: a phase killed below must not break a later mpirun.
    with private_session_base(BASE_VARIABLE if args.hosts is None else None, env) as env:
        proc = subprocess.Popen(mpirun_cmd(np_ or args.np, args.hosts, env) + argv, cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=sys.stderr, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            error = f"phase {phase} timed out after {args.timeout} s"
    for line in out.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            if repeat is not None:
                rec["repeat"] = repeat
            records.append(rec)
            emit(rec)
        elif line.strip():
            print(line, file=sys.stderr)
    if error is None and proc.returncode != 0:
        error = f"phase {phase} exited with {proc.returncode}"
    return records, error


def _find(records: list[dict], system: str, case: str, size: Optional[int] = None,
          dtype: str = "float32") -> Optional[dict]:
    """The first measured record matching system/case/size/dtype, or None."""
    for r in records:
        if (r.get("system") == system and r.get("case") == case and r.get("dtype") == dtype
                and (size is None or r.get("size_bytes") == size) and r.get("seconds")):
            return r
    return None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a / b rounded, or None when either side was not measured."""
    return round(a / b, 3) if a and b else None


def measure_ratios(records: list[dict], args: argparse.Namespace) -> dict:
    """The measured figures issue #3 is judged by, from one set of result lines.

    Returns:
        {field: value}; per-size fields are {size: value}. None where not measured.
    """
    big = [s for s in args.sizes if s >= MIB]
    busbw_vs_mpi, best_vs_mpi, vs_out_of_place, graph_vs_mpi, mwms_vs_mpi, comp, comp8 = {}, {}, {}, {}, {}, {}, {}
    for s in big:
        mpi = _find(records, "mpi", "single", s)
        sm = _find(records, "smdist_tf", "single", s)
        oop = _find(records, "mpi", "single_out_of_place", s)
        vs_out_of_place[str(s)] = _ratio(sm and sm["busbw"], oop and oop["busbw"])
        graph = _find(records, "smdist_tf_graph", "single", s)
        graph_vs_mpi[str(s)] = _ratio(graph and graph["busbw"], mpi and mpi["busbw"])
        mw = _find(records, "mwms", "single", s)
        busbw_vs_mpi[str(s)] = _ratio(sm and sm["busbw"], mpi and mpi["busbw"])
        # Same ratio from each side's best repetition: steadier while others load the machine.
        best_vs_mpi[str(s)] = _ratio(mpi and mpi.get("seconds_min"), sm and sm.get("seconds_min"))
        mwms_vs_mpi[str(s)] = _ratio(mw and mw["busbw"], mpi and mpi["busbw"])
        c16 = _find(records, "smdist_tf", "fp16_compression", s)
        comp[str(s)] = _ratio(c16 and c16["seconds"], sm and sm["seconds"])
        c8 = _find(records, "smdist_tf", "int8_compression", s)
        comp8[str(s)] = _ratio(c8 and c8["seconds"], sm and sm["seconds"])
    adasum_vs_sum = {}
    for s in args.sizes:
        ada, sm = _find(records, "smdist_tf", "adasum", s), _find(records, "smdist_tf", "single", s)
        adasum_vs_sum[str(s)] = _ratio(ada and ada["seconds"], sm and sm["seconds"])

    def micros(rec: Optional[dict], key: str = "seconds") -> Optional[float]:
        return round(rec[key] * 1e6, 1) if rec and rec.get(key) else None

    lat = _find(records, "smdist_tf", "single", 4096)
    fused = _find(records, "smdist_tf", "resnet50_grads_fused")
    unfused = _find(records, "smdist_tf", "resnet50_grads_unfused")
    loop = _find(records, "smdist_tf", "resnet50_grads_eager_loop")
    per_tensor = _find(records, "smdist_tf", "resnet50_grads_graph_per_tensor")
    small_fused = _find(records, "smdist_tf", "resnet50_small_grads_fused")
    small_unfused = _find(records, "smdist_tf", "resnet50_small_grads_unfused")
    small_mpi = _find(records, "mpi", "resnet50_small_grads_loop")
    many_fused = _find(records, "smdist_tf", "many_small_fused")
    many_unfused = _find(records, "smdist_tf", "many_small_unfused")
    many_mpi = _find(records, "mpi", "many_small_loop")
    memcpy = _find(records, "memcpy", "local_copy")
    return {
        "busbw_ratio_smdist_vs_mpi_fp32": busbw_vs_mpi,
        "busbw_ratio_smdist_vs_mpi_fp32_best_rep": best_vs_mpi,
        "busbw_ratio_smdist_vs_mpi_out_of_place_fp32": vs_out_of_place,
        # Like for like with MPI_IN_PLACE: inside tf.function the op reduces in place.
        "busbw_ratio_smdist_tf_function_vs_mpi_fp32": graph_vs_mpi,
        "latency_4KiB_eager_us": micros(lat),
        "latency_4KiB_eager_best_rep_us": micros(lat, "seconds_min"),
        "latency_4KiB_tf_function_us": micros(_find(records, "smdist_tf_graph", "single", 4096)),
        "latency_4KiB_mpi_us": micros(_find(records, "mpi", "single", 4096)),
        "latency_4KiB_eager_unnamed_us": micros(_find(records, "smdist_tf", "single_unnamed", 4096)),
        "resnet50_fused_s": fused and fused["seconds"], "resnet50_unfused_s": unfused and unfused["seconds"],
        "resnet50_eager_loop_s": loop and loop["seconds"],
        "resnet50_graph_per_tensor_s": per_tensor and per_tensor["seconds"],
        "fused_speedup_vs_unfused": _ratio(unfused and unfused["seconds"], fused and fused["seconds"]),
        "fused_speedup_vs_eager_loop": _ratio(loop and loop["seconds"], fused and fused["seconds"]),
        "resnet50_small_fused_s": small_fused and small_fused["seconds"],
        "resnet50_small_unfused_s": small_unfused and small_unfused["seconds"],
        "resnet50_small_mpi_loop_s": small_mpi and small_mpi["seconds"],
        "fused_speedup_vs_unfused_small_tensors": _ratio(small_unfused and small_unfused["seconds"],
                                                         small_fused and small_fused["seconds"]),
        "many_small_fused_s": many_fused and many_fused["seconds"],
        "many_small_unfused_s": many_unfused and many_unfused["seconds"],
        "many_small_mpi_loop_s": many_mpi and many_mpi["seconds"],
        "fused_speedup_vs_unfused_many_small": _ratio(many_unfused and many_unfused["seconds"],
                                                      many_fused and many_fused["seconds"]),
        "many_small_fused_speedup_vs_mpi_loop": _ratio(many_mpi and many_mpi["seconds"],
                                                       many_fused and many_fused["seconds"]),
        "fp16_compression_time_ratio_vs_fp32": comp,
        "int8_compression_time_ratio_vs_fp32": comp8,
        "adasum_time_ratio_vs_sum_fp32": adasum_vs_sum,
        "busbw_ratio_mwms_vs_mpi_fp32": mwms_vs_mpi,
        "memcpy_GBps": memcpy and memcpy["algbw_GBps"],
    }


def median_of_repeats(per_repeat: list[dict]) -> dict:
    """Combines measure_ratios() results of several repeats: the median of each figure (per size for
    per-size fields), ignoring repeats that did not measure it.

    Args:
        per_repeat: one measure_ratios() dict per repeat, all with the same fields.

    Returns:
        A dict of the same shape.
    """

    def median(values: list) -> Optional[float]:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 4) if present else None

    combined: dict[str, Any] = {}
    for key, first in per_repeat[0].items():
        if isinstance(first, dict):
            combined[key] = {size: median([r[key].get(size) for r in per_repeat]) for size in first}
        else:
            combined[key] = median([r[key] for r in per_repeat])
    return combined


def summarize(figures: dict, records: list[dict], args: argparse.Namespace, errors: list[str], load: dict) -> dict:
    """The summary line: ``figures`` (from measure_ratios or median_of_repeats) and the targets judged on them.

    Returns:
        One summary dict (``"summary": true``).
    """
    ratios = [v for v in figures["busbw_ratio_smdist_vs_mpi_fp32"].values() if v is not None]
    big16 = [v for k, v in figures["busbw_ratio_smdist_vs_mpi_fp32"].items() if int(k) >= 16 * MIB and v is not None]
    comps = [v for v in figures["fp16_compression_time_ratio_vs_fp32"].values() if v is not None]
    lat, speedup = figures["latency_4KiB_eager_us"], figures["fused_speedup_vs_unfused"]
    paired = [v for key in ("busbw_ratio_smdist_vs_mpi_out_of_place_fp32", "busbw_ratio_smdist_tf_function_vs_mpi_fp32")
              for v in figures[key].values() if v is not None]
    like_for_like = min(paired) if paired else None
    summary = {"summary": True, "np": args.np, "sizes": args.sizes, "quick": args.quick, "repeats": args.repeat}
    summary.update(figures)
    summary.update({
        "min_busbw_ratio_ge_1MiB": min(ratios) if ratios else None,
        "target_busbw_ge_1x_mpi": (min(ratios) >= 1.0) if ratios else None,
        # Like for like: an eager op cannot overwrite a tensor Python still holds, so eager runs
        # out of place against MPI out of place, and the tf.function chain in place against MPI
        # in place. The target above pits eager against MPI in place, the harder comparison.
        "min_busbw_ratio_ge_1MiB_like_for_like": like_for_like,
        "target_busbw_ge_1x_mpi_like_for_like": (like_for_like >= 1.0) if like_for_like is not None else None,
        "target_busbw_ge_2x_mpi_ge_16MiB": (min(big16) >= 2.0) if big16 else None,
        "target_latency_4KiB_le_100us": (lat <= 100.0) if lat is not None else None,
        "target_fused_ge_3x": (speedup >= 3.0) if speedup is not None else None,
        "fp16_compression_wire_bytes_ratio": 0.5,
        "int8_compression_wire_bytes_ratio": round((1 + 4 / 256) / 4, 4),
        "target_fp16_compression_faster_ge_1MiB": (max(comps) < 1.0) if comps else None,
        "smdist_engine_config": _find_config(records),
        "load_average": load,
        "systems_present": sorted({r["system"] for r in records if r.get("seconds")}),
        "errors": errors,
    })
    return summary


def _library_mtime() -> Optional[str]:
    """When the engine library was built: the C++ engine changes under us while we measure."""
    lib = ROOT / "smdist_tf" / "libsmdist_core.so"
    if not lib.exists():
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(lib.stat().st_mtime))


def _find_config(records: list[dict]) -> Optional[dict]:
    """The smdist engine configuration reported by the core phase, if any."""
    for r in records:
        if r.get("case") == "engine_config":
            return r.get("config")
    return None


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Command line of both the driver and the workers."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2, help="ranks to launch (driver only)")
    p.add_argument("--quick", action="store_true", help="sizes 4K and 1M, 3 repetitions: a smoke run")
    p.add_argument("--sizes", type=parse_sizes,
                   help="comma-separated sizes, e.g. 4K,1M,64M (default 4K..64M in powers of 4)")
    p.add_argument("--iters", type=int, help="timed repetitions per case; the median is reported (default 5)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the smdist_tf/mpi phase this many times (fresh processes); the summary reports "
                        "the median of each figure over the runs, and one repeat_summary line per run")
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=DTYPES, help="subset of float32,float16,bfloat16")
    p.add_argument("--systems", type=lambda s: s.split(","), default=ALL_SYSTEMS,
                   help="subset of smdist_tf,mpi,mwms,memcpy")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds allowed per mpirun phase")
    p.add_argument("--two-hosts", action="store_true",
                   help="split the ranks over two hosts played by network namespaces joined by a veth pair "
                        "(TCP between them; needs root): a network hop on one machine. MWMS is left out")
    p.add_argument("--process-set", action="store_true",
                   help="process sets instead of the usual phases: a 2-rank job alone, then a 4-rank job where "
                        "the sets [0,1] and [2,3] each run the allreduce at the same time (fp32, eager, Sum); "
                        "--np is ignored")
    p.add_argument("--worker", choices=["core", "mwms", "pset_alone", "pset_sets"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    args.iters = args.iters or (3 if args.quick else 5)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    bad = set(args.systems) - set(ALL_SYSTEMS) or set(args.dtypes) - set(DTYPES)
    if bad:
        p.error(f"unknown system/dtype: {sorted(bad)}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Driver (launches the phases and prints the summary) or, with ``--worker``, one phase."""
    args = parse_args(argv)
    workers = {"core": worker_core, "mwms": worker_mwms, "pset_alone": worker_pset_alone, "pset_sets": worker_pset_sets}
    if args.worker in workers:
        workers[args.worker](args)
        return 0
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        sys.exit("run the driver without mpirun: python benchmarks/allreduce.py --np N (it launches mpirun)")
    args.hosts = None
    if args.process_set:
        if args.two_hosts:
            sys.exit("--process-set runs on one host; leave out --two-hosts")
        return _drive_process_sets(args)
    if args.two_hosts:
        sys.path.insert(0, str(ROOT))
        from benchmarks.netns_hosts import Unavailable, two_namespace_hosts

        args.systems = [s for s in args.systems if s != "mwms"]  # its loopback gRPC cluster spans one host
        try:
            with two_namespace_hosts() as hosts:
                args.hosts = hosts
                return _drive(args)
        except Unavailable as why:
            sys.exit(f"--two-hosts: {why}")
    return _drive(args)


def _drive(args: argparse.Namespace) -> int:
    """Measures memcpy, runs the mpirun phases and prints the summary; 1 if a phase failed."""
    load: dict[str, Any] = {"start": list(os.getloadavg()), "library_mtime_utc": _library_mtime()}
    records: list[dict] = []
    errors: list[str] = []
    if "memcpy" in args.systems:
        rec = measure_memcpy(args.np, args.iters)
        records.append(rec)
        emit(rec)
    core = {"smdist_tf", "mpi"} & set(args.systems)
    # The core phase runs `repeat` times (fresh processes each time: this VM's speed drifts between
    # runs more than within one), MWMS once; the summary takes the median of each figure.
    per_repeat: list[dict] = []
    for rep in range(args.repeat if core else 0):
        recs, err = run_phase("core", args, rep if args.repeat > 1 else None)
        records += recs
        if err:
            errors.append(err)
        per_repeat.append(recs)
    if "mwms" in args.systems:
        recs, err = run_phase("mwms", args)
        records += recs
        if err:
            errors.append(err)
    shared = [r for r in records if "repeat" not in r]
    figures_per_repeat = [measure_ratios(shared + recs, args) for recs in per_repeat] or [measure_ratios(records, args)]
    if len(figures_per_repeat) > 1:
        for rep, figures in enumerate(figures_per_repeat):
            emit({"repeat_summary": rep, "np": args.np, **figures})
    load["end"] = list(os.getloadavg())
    summary = summarize(median_of_repeats(figures_per_repeat), records, args, errors,
                        {"start": load["start"], "end": load["end"]})
    summary["two_hosts"] = args.hosts is not None
    summary["smdist_library_mtime_utc"] = load["library_mtime_utc"]
    summary["smdist_library_rebuilt_during_run"] = load["library_mtime_utc"] != _library_mtime()
    emit(summary)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
