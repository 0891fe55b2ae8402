"""Synthetic Keras training throughput: smdist_tf's DataParallelStrategy vs TF's MultiWorkerMirroredStrategy.

One run measures both strategies at 1, 2 and 4 processes on the same model (many
small gradient tensors, so per-tensor overheads and fusion matter) and prints one
JSON line per measurement, then a summary line:

    python benchmarks/synthetic.py [--ranks 1 2 4] [--steps 30]

Each worker times steady-state training steps (``strategy.run`` of a Keras model and
optimizer in a tf.function, after warm-up), then the same step without any strategy
on its local batch; the difference is the share of the step spent on communication
and synchronisation.
Weak scaling: the per-process batch is fixed, the global batch grows with ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_model(layers: int, width: int):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(layers)] + [keras.layers.Dense(10)])
    return model, keras.optimizers.SGD(0.01)


def timed_steps(strategy, model, optimizer, batch: int, width: int, steps: int, warmup: int) -> float:
    """Seconds per training step (``strategy.run`` in a tf.function) over ``steps`` steady-state steps.

    A custom loop rather than ``model.fit``: Keras 3.15's ``fit`` under a multi-worker
    MultiWorkerMirroredStrategy fails here (a PerReplica batch reaches a tensor
    conversion), and the loop times both strategies on exactly the same code.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 4, width)).astype(np.float32)
    y = rng.integers(0, 10, size=(batch * 4,))
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    @tf.function
    def train_step(inputs):
        def step_fn(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(labels, model(features, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return strategy.run(step_fn, args=inputs)

    for _ in range(warmup):
        train_step(next(iterator))
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(next(iterator))
    strategy.experimental_local_results(loss)[0].numpy()  # wait for the last step
    return (time.perf_counter() - start) / steps


def worker(args: argparse.Namespace) -> None:
    """Runs in each benchmark process; the first process prints its result as JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if args.kind == "smdist":
        import smdist_tf as sd

        strategy = sd.DataParallelStrategy()
        index, count = sd.rank(), sd.size()
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        index, count = args.index, args.count
    with strategy.scope():
        model, optimizer = build_model(args.layers, args.width)
    global_batch = args.batch * count
    step = timed_steps(strategy, model, optimizer, global_batch, args.width, args.steps, args.warmup)
    # The same step without any strategy on the local batch: compute only.
    local_model, local_optimizer = build_model(args.layers, args.width)
    compute = timed_steps(tf.distribute.get_strategy(), local_model, local_optimizer, args.batch, args.width, args.steps, args.warmup)
    if index == 0:
        result = {
            "strategy": args.kind,
            "ranks": count,
            "gradient_tensors": len(model.trainable_variables),
            "global_batch": global_batch,
            "step_ms": round(step * 1e3, 3),
            "compute_only_step_ms": round(compute * 1e3, 3),
            "samples_per_sec": round(global_batch / step, 1),
            "communication_share": round(max(0.0, 1.0 - compute / step), 3),
        }
        print("RESULT " + json.dumps(result), flush=True)


def free_ports(n: int) -> list:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def worker_argv(args: argparse.Namespace, kind: str) -> list:
    return [str(Path(__file__).resolve()), "--worker", kind, "--layers", str(args.layers), "--width", str(args.width),
            "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]


def parse_result(out: str) -> dict:
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"no result in worker output:\n{out[-3000:]}")


def run_smdist(args: argparse.Namespace, ranks: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.mpi_harness import run_under_mpi

    code, out = run_under_mpi(ranks, worker_argv(args, "smdist"), timeout=args.timeout)
    if code != 0:
        raise RuntimeError(f"smdist run with {ranks} ranks failed ({code}):\n{out[-3000:]}")
    return parse_result(out)


def run_mwms(args: argparse.Namespace, ranks: int) -> dict:
    ports = free_ports(ranks)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = []
    for i in range(ranks):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        if ranks > 1:
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        else:
            env.pop("TF_CONFIG", None)
        argv = [sys.executable] + worker_argv(args, "mwms") + ["--index", str(i), "--count", str(ranks)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
    deadline = time.time() + args.timeout
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"MultiWorkerMirroredStrategy with {ranks} workers failed:\n{outputs[0][-3000:]}")
    return parse_result(outputs[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=["smdist", "mwms"], choices=["smdist", "mwms"])
    parser.add_argument("--layers", type=int, default=24, help="hidden Dense layers (2 gradient tensors each)")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64, help="per process")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--worker", choices=["smdist", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.kind = args.worker
        worker(args)
        return

    results: dict = {}
    for kind in args.strategies:
        for ranks in args.ranks:
            result = run_smdist(args, ranks) if kind == "smdist" else run_mwms(args, ranks)
            results[(kind, ranks)] = result
            print(json.dumps(result), flush=True)
    summary = {"summary": {}, "cpu_count": os.cpu_count()}
    for kind in args.strategies:
        base = results.get((kind, min(args.ranks)))
        for ranks in args.ranks:
            r = results[(kind, ranks)]
            efficiency = r["samples_per_sec"] / (base["samples_per_sec"] * ranks / base["ranks"])
            summary["summary"][f"{kind}@{ranks}"] = {"samples_per_sec": r["samples_per_sec"], "scaling_efficiency": round(efficiency, 3),
                                                     "communication_share": r["communication_share"]}
    for ranks in args.ranks:
        if ("smdist", ranks) in results and ("mwms", ranks) in results:
            summary["summary"][f"smdist_vs_mwms_throughput@{ranks}"] = round(
                results[("smdist", ranks)]["samples_per_sec"] / results[("mwms", ranks)]["samples_per_sec"], 3)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
