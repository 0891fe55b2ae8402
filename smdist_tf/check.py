"""``python -m smdist_tf.check``: what this smdist_tf install has, and whether its GPU paths work.

The report says what the installed ops were built with (CPU/GPU kernels, XLA lowerings per
device, the XLA handler library), what merely loads on this machine (the CUDA runtime,
NCCL), what TensorFlow sees, and MPI. ``smdistrun --check-build`` prints the same report.

With ``--gpu`` it runs one real allreduce per path on each GPU TensorFlow sees, under
TensorFlow, each in a process of its own (the engine picks its GPU path when it starts):

* ``nccl``: the TF GPU kernel, NCCL on TensorFlow's stream;
* ``host-staged``: the same with ``SMDIST_GPU_OPERATIONS=MPI`` (device -> host -> device);
* ``xla``: ``tf.function(jit_compile=True)``, the XLA GPU lowering and the CUDA handler;

checks each result and reports the path the engine's timeline recorded; and

* ``offload``: activation offloading (``OffloadActivations``, no collective): the gradients of
  8 ``Dense(1024)`` blocks on 4,096 rows with and without it, and the GPU's peak memory in each
  step (the saving expected from holding the activations on the host).

Exit status 0 when every check passed (1 otherwise, 2 when there is no GPU or no GPU kernel to check).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

PATHS = {"nccl": {}, "host-staged": {"SMDIST_GPU_OPERATIONS": "MPI"}, "xla": {}, "offload": {}}


def _mark(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def report() -> str:
    """The report text. Importing smdist_tf here checks the native build and the TensorFlow version."""
    import tensorflow as tf

    import smdist_tf as sd
    from smdist_tf.run.errors import UsageError
    from smdist_tf.run.mpi_command import detect_flavour, find_mpirun

    info = sd.get_build_info()
    gpu_kernels = bool(info.get("gpu_kernels"))
    package = Path(sd.__file__).resolve().parent
    try:
        mpirun = find_mpirun(os.environ)
        flavour = detect_flavour(mpirun)
        mpirun_line = f"{mpirun} ({flavour.name} {flavour.version})"
    except UsageError as e:
        mpirun_line = f"not usable: {e}"
    nccl = sd.nccl_built()
    gpus = tf.config.list_physical_devices("GPU")
    lines = [
        f"smdist_tf {sd.__version__} ({package})",
        "",
        "Framework:",
        f"    {_mark(True)} TensorFlow {tf.__version__} (built against {info.get('tensorflow_version')}; "
        f"CUDA build of TensorFlow: {bool(tf.sysconfig.get_build_info().get('is_cuda_build'))})",
        f"    GPUs TensorFlow sees: {len(gpus)}",
        "",
        "Controllers:",
        f"    {_mark(sd.mpi_built())} MPI ({info.get('mpi_flavour')}, mpicxx {info.get('mpicxx')})",
        f"    {_mark(sd.gloo_built())} Gloo",
        "",
        "Op kernels (what the installed ops were built with):",
        f"    {_mark(True)} CPU",
        f"    {_mark(gpu_kernels)} GPU" + ("" if gpu_kernels else " (CPU variant: GPU tensors are copied to the host)"),
        "",
        "XLA lowerings (jit_compile):",
        f"    {_mark(True)} XLA_CPU_JIT",
        f"    {_mark(gpu_kernels)} XLA_GPU_JIT",
        f"    {_mark((package / 'libsmdist_xla.so').is_file())} XLA handler library (libsmdist_xla.so)",
        "",
        "Loads on this machine (used only by GPU kernels):",
        f"    {_mark(sd.cuda_built())} CUDA runtime",
        f"    {_mark(bool(nccl))} NCCL" + (f" (version code {nccl})" if nccl else ""),
        "",
        "Tensor operations:",
        f"    {_mark(gpu_kernels and bool(nccl))} NCCL (GPU tensors on the GPU)",
        f"    {_mark(sd.mpi_built())} MPI (CPU collectives; GPU tensors staged through the host)",
        "",
        f"mpirun: {mpirun_line}",
    ]
    return "\n".join(lines)


def _check_offload(gpu: int) -> dict:
    """In this process: a step of offloaded blocks on GPU `gpu` against the same blocks plain.

    ``ok`` when the gradients agree and, where there is a GPU, offloading lowered the step's
    peak GPU memory. Without a GPU TensorFlow places it on the CPU, with fewer rows.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from smdist_tf.pipeline.offload import OffloadActivations

    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    x = tf.constant(np.random.default_rng(0).normal(size=(4096 if on_gpu else 32, 1024)).astype(np.float32))
    grads, peaks = {}, {}
    for offload in (False, True):
        keras.utils.set_random_seed(0)
        with tf.device(f"/GPU:{gpu}"):
            blocks = [keras.layers.Dense(1024, activation="relu") for _ in range(8)]
            model = keras.Sequential([keras.Input((1024,))] + [OffloadActivations(b) if offload else b for b in blocks])

            @tf.function(jit_compile=False)
            def step(x):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(model(x, training=True))
                return tape.gradient(loss, model.trainable_variables)

            step(x)  # traced, and TensorFlow's allocator warmed up
            if on_gpu:
                tf.config.experimental.reset_memory_stats(f"GPU:{gpu}")
            grads[offload] = [g.numpy() for g in step(x)]
            peaks[offload] = tf.config.experimental.get_memory_info(f"GPU:{gpu}")["peak"] if on_gpu else None
    same = all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads[False], grads[True]))
    lower = not on_gpu or peaks[True] < peaks[False]
    return {"path": "offload", "gpu": gpu, "ok": same and lower, "same_gradients": same,
            "peak_bytes_plain": peaks[False], "peak_bytes_offloaded": peaks[True]}


def _run_one(path: str, gpu: int, timeline: str) -> dict:
    """In this process: one allreduce on GPU `gpu` along `path` (or the offload check); returns what happened."""
    import tensorflow as tf

    import smdist_tf as sd

    if path == "offload":
        return _check_offload(gpu)

    sd.init()
    sd.start_timeline(timeline)
    values = [1.0, 2.0, 3.0, 4.0]
    with tf.device(f"/GPU:{gpu}"):
        x = tf.constant(values)
        if path == "xla":
            result = tf.function(lambda t: sd.allreduce(t, op=sd.Sum, name="check.xla"), jit_compile=True)(x)
        else:
            result = sd.allreduce(x, op=sd.Sum, name=f"check.{path}")
    got = result.numpy().tolist()
    device = result.device
    sd.stop_timeline()
    text = Path(timeline).read_text() if Path(timeline).exists() else ""
    recorded = sorted(set(re.findall(r'"path":"([^"]+)"', text)))
    staged = "MEMCPY_IN_HOST_BUFFER" in text
    return {"path": path, "gpu": gpu, "ok": got == [v * sd.size() for v in values], "result": got,
            "device": device, "timeline_paths": recorded, "staged_through_host": staged}


def run_gpu_checks(python: str = sys.executable, timeout: float = 300) -> tuple[int, list[dict]]:
    """Runs every path on every visible GPU, each in a fresh process; returns (exit code, results)."""
    import tensorflow as tf

    from smdist_tf._native import build_info

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return 2, [{"error": "TensorFlow sees no GPU here: nothing to check (install `tensorflow[and-cuda]`, "
                             "and check `nvidia-smi`)"}]
    if not build_info.get("gpu_kernels"):
        return 2, [{"error": "these smdist_tf ops have CPU kernels only: build the GPU variant "
                             "(`SMDIST_GPU=1 bash scripts/bootstrap.sh`, see docs/gpus.md) to check the GPU paths"}]
    results, status = [], 0
    with tempfile.TemporaryDirectory(prefix="smdist_check_") as tmp:
        for gpu in range(len(gpus)):
            for path, extra in PATHS.items():
                timeline = str(Path(tmp) / f"{path}.{gpu}.json")
                env = dict(os.environ, **extra)
                done = subprocess.run([python, "-m", "smdist_tf.check", "--run-path", path, "--gpu-index", str(gpu),
                                       "--timeline", timeline], env=env, capture_output=True, text=True,
                                      timeout=timeout)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                result = json.loads(lines[-1]) if done.returncode == 0 and lines else {
                    "path": path, "gpu": gpu, "ok": False, "error": (done.stderr or done.stdout)[-2000:]}
                status |= 0 if result.get("ok") else 1
                results.append(result)
    return status, results


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smdist_tf.check", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run one real allreduce per GPU path on each GPU")
    parser.add_argument("--run-path", choices=sorted(PATHS), help=argparse.SUPPRESS)  # one check, in a child
    parser.add_argument("--gpu-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--timeline", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_path:
        print(json.dumps(_run_one(args.run_path, args.gpu_index, args.timeline)), flush=True)
        return 0
    print(report(), flush=True)
    if not args.gpu:
        return 0
    status, results = run_gpu_checks()
    print("\nGPU checks:")
    for r in results:
        if "path" not in r:
            print(f"    {r['error']}")
            continue
        if "same_gradients" in r:
            detail = (f"gradients {'equal' if r['same_gradients'] else 'DIFFER'} with and without; peak GPU bytes "
                      f"{r['peak_bytes_plain']} plain, {r['peak_bytes_offloaded']} offloaded")
        elif "result" in r:
            detail = (f"result {r['result']} on {r['device']}, timeline path {r['timeline_paths'] or 'none'}"
                      f"{', staged through the host' if r.get('staged_through_host') else ''}")
        else:
            detail = r.get("error", "")
        print(f"    {_mark(r['ok'])} GPU {r['gpu']} {r['path']}: {detail}")
    return status


if __name__ == "__main__":
    sys.exit(main())
