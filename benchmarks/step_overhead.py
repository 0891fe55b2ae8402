"""What smdist_tf adds to a training step, by number of gradient tensors (issue #26 item 3).

    python benchmarks/step_overhead.py                 # one process: a job of one
    smdistrun -np 2 python benchmarks/step_overhead.py  # two ranks

Each step differentiates a loss of ``--tensors`` tiny variables (``--elements`` floats
each) and applies SGD, so compute is negligible and what remains is per-step and
per-tensor cost. Systems, each eagerly and in a ``tf.function``:

  plain      tf.GradientTape and the optimizer, no smdist_tf (the reference)
  tape       smdist_tf.DistributedGradientTape
  optimizer  smdist_tf.keras.DistributedOptimizer (its ``apply`` reduces the gradients)
  strategy   DataParallelStrategy: ``strategy.run`` of the step on a distributed dataset's batch
  allreduce  no training: ``grouped_allreduce`` of ``--tensors`` gradient-sized tensors alone, so
             its whole time is smdist_tf's (Python, TensorFlow's dispatch, the engine and the wire)

Every (system, mode, tensors) case is timed in turn ``--repeats`` times, the order reversed
on odd repeats; rank 0 prints one JSON line per case (median microseconds per step, the
slowest rank's, and ``over_plain_us``, the extra over ``plain`` in the same mode; for
``allreduce``, its whole step) and a summary per system and mode: ``extra_us_per_tensor``, the
slope of the extra cost from the fewest to the most tensors, and ``extra_us_fixed``, the extra
cost at the fewest tensors. With several ranks a training step's extra also holds the wait for
the slowest rank's step, which grows with the step's own work (eager steps most).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import smdist_tf as sd  # noqa: E402
import smdist_tf.keras as sdk  # noqa: E402

SYSTEMS = ("plain", "tape", "optimizer", "strategy", "allreduce")
MODES = ("eager", "function")


def make_step(system: str, mode: str, tensors: int, elements: int) -> Callable[[], None]:
    """A zero-argument callable running one training step of ``system`` in ``mode``."""
    if system == "allreduce":
        if mode == "eager":
            values = [tf.fill([elements], float(k)) for k in range(tensors)]
            return lambda: sd.grouped_allreduce(values)
        # Made inside the function: a tf.function's own cost per tensor argument is TensorFlow's, not ours.
        return tf.function(lambda: sd.grouped_allreduce([tf.fill([elements], float(k)) for k in range(tensors)]))
    strategy = sd.DataParallelStrategy() if system == "strategy" else tf.distribute.get_strategy()
    with strategy.scope():
        variables = [keras.Variable(np.full([elements], 0.5, np.float32), name=f"w{k}") for k in range(tensors)]
        optimizer = keras.optimizers.SGD(1e-3)
        if system == "optimizer":
            optimizer = sdk.DistributedOptimizer(optimizer)
        optimizer.build(variables)
    # One row per replica: the strategy splits the global batch over the ranks.
    rows = strategy.num_replicas_in_sync if system == "strategy" else 1
    data = tf.data.Dataset.from_tensors(tf.ones([elements])).repeat().batch(rows)
    iterator = iter(strategy.experimental_distribute_dataset(data) if system == "strategy" else data)

    def step_fn(x):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * x) for v in variables])
        if system == "tape":
            tape = sd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, variables)
        optimizer.apply(grads, variables)
        return loss

    def step(x):
        return strategy.run(step_fn, args=(x,)) if system == "strategy" else step_fn(x)

    compiled = tf.function(step) if mode == "function" else step

    def run() -> None:
        compiled(next(iterator))

    return run


def time_steps(run: Callable[[], None], steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--elements", type=int, default=16, help="floats per variable")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    sd.init()
    cases = [(s, m, n) for m in args.modes for n in args.tensors for s in args.systems]
    runs = {case: make_step(*case, args.elements) for case in cases}
    for run in runs.values():
        time_steps(run, args.warmup)
    samples: dict[tuple, list[float]] = {case: [] for case in cases}
    for repeat in range(args.repeats):
        for case in cases if repeat % 2 == 0 else cases[::-1]:
            sd.barrier(name="bench.overhead")
            samples[case] += time_steps(runs[case], args.steps)
    # Every rank's medians; the slowest rank's is reported.
    mine = tf.constant([[statistics.median(samples[case]) for case in cases]], tf.float64)
    medians = dict(zip(cases, np.max(sd.allgather(mine, name="bench.overhead.gather").numpy(), axis=0) * 1e6))
    if sd.rank() != 0:
        return

    def extra(system: str, mode: str, n: int) -> Optional[float]:
        if system == "allreduce":
            return medians[(system, mode, n)]
        if "plain" not in args.systems:
            return None
        return medians[(system, mode, n)] - medians[("plain", mode, n)]

    for system, mode, n in cases:
        over = extra(system, mode, n)
        print(json.dumps({
            "system": system, "mode": mode, "tensors": n, "ranks": sd.size(),
            "step_us": round(medians[(system, mode, n)], 1),
            "over_plain_us": None if over is None else round(over, 1),
        }), flush=True)
    fewest, most = min(args.tensors), max(args.tensors)
    for mode in args.modes:
        for system in args.systems:
            if system == "plain" or extra(system, mode, fewest) is None:
                continue
            cost = {n: extra(system, mode, n) for n in (fewest, most)}
            print(json.dumps({
                "summary": system, "mode": mode, "ranks": sd.size(), "repeats": args.repeats,
                "extra_us_fixed": round(cost[fewest], 1),
                "extra_us_per_tensor": round((cost[most] - cost[fewest]) / (most - fewest), 2)
                if most > fewest else None,
            }), flush=True)


if __name__ == "__main__":
    main()
