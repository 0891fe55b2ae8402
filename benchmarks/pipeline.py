"""Pipeline-parallel step time against one process training the whole model; bubble, memory, GPipe vs 1F1B.

    smdistrun -np 2 python benchmarks/pipeline.py --microbatches 1 2 4 8

Every process runs TensorFlow with ``--threads`` intra-op and inter-op threads (default 1),
so each stage has a core of its own on a machine with a core per rank. The reference is
one process with the same threads training the whole model on the same batch: the same
forward and backward in one ``tf.function``, no optimizer update (``pipeline_gradients``
applies none either). It runs on rank 0 while the other ranks wait in a receive, which
leaves their cores idle. Every configuration
and the reference are timed in turn, ``--repeats`` times, the order reversed on odd repeats.

Prints one JSON line per (schedule, microbatches) on rank 0:
  step_seconds        median wall time of one training step (schedule + gradient sync), slowest rank
  single_process_seconds  median step of the one-process reference
  over_single_process step_seconds / single_process_seconds (below 1: the pipeline is faster)
  bubble_measured     per stage, the share of the step spent blocked in receives
  bubble_theory       (p - 1) / (m + p - 1)
  peak_microbatches   per stage, most microbatches of activations held at once
  peak_activation_bytes  per stage, bytes of stage inputs and outputs held at that peak
  model_weight_bytes  bytes of the whole model's weights
  held_weight_bytes   per stage, bytes of the weights its rank holds (built from a model function)
  build_peak_bytes    per stage, the CPU allocator's peak growth while the PipelineModel was built
                      (null if TensorFlow's BFC CPU allocator is off)
and then one summary line per schedule: ``over_single_process`` per microbatch count and
``most_over_fewest_microbatches`` (below 1: more microbatches are faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import smdist_tf as sd  # noqa: E402
from smdist_tf.keras import PipelineModel  # noqa: E402
from smdist_tf.pipeline import recv, send  # noqa: E402
from smdist_tf.pipeline import schedule as schedule_lib  # noqa: E402

_TAG_SINGLE_DONE = 11


def build_model(width: int, depth: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


def _bytes(variables: list) -> int:
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)


class SingleProcess:
    """The reference: one process computing the whole model's gradients on the whole batch."""

    def __init__(self, args: argparse.Namespace, loss: keras.losses.Loss):
        self.model = build_model(args.width, args.depth)
        variables = self.model.trainable_variables

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                value = loss(y, self.model(x, training=True))
            return value, tape.gradient(value, variables)

        self.step = step

    def time(self, x: tf.Tensor, y: tf.Tensor) -> float:
        start = time.perf_counter()
        value, grads = self.step(x, y)
        value.numpy()
        _ = [g.numpy() for g in grads[-1:]]
        return time.perf_counter() - start


class Pipeline:
    """One PipelineModel configuration and its timings."""

    def __init__(self, args: argparse.Namespace, loss: keras.losses.Loss, stages: int, schedule: str, m: int):
        self.schedule, self.m, self.stages = schedule, m, stages
        try:
            base = tf.config.experimental.get_memory_info("CPU:0")["current"]
            tf.config.experimental.reset_memory_stats("CPU:0")
        except ValueError:  # the default (non-BFC) CPU allocator keeps no statistics
            base = None
        # Built from a function: each rank materialises its own stage's weights only.
        self.model = PipelineModel(lambda: build_model(args.width, args.depth), num_stages=stages,
                                   num_microbatches=m, schedule=schedule, partition=args.partition, verbose=False)
        self.build_peak = -1 if base is None else tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
        self.held = _bytes(self.model.held_variables)
        self.full = _bytes(self.model.unpartitioned.variables)
        self.model.compile(optimizer="sgd", loss=loss)
        self.times: list[float] = []
        self.bubbles: list[float] = []

    def time(self, x: tf.Tensor, y: tf.Tensor, steps: int) -> None:
        for _ in range(steps):
            sd.barrier(name="bench.step")
            start = time.perf_counter()
            self.model.pipeline_gradients(x, y)
            seconds = time.perf_counter() - start
            self.times.append(seconds)
            self.bubbles.append(self.model._runner.stats.waiting_seconds / seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--stages", type=int, default=0, help="default: all ranks")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--partition", default="auto", help="PipelineModel's partition (auto or uniform)")
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op and inter-op threads per process")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    sd.init()
    stages = args.stages or sd.size()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(args.batch_size, args.width)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, args.batch_size))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    pipelines = [Pipeline(args, loss, stages, s, m) for s in args.schedules for m in args.microbatches]
    single = SingleProcess(args, loss) if sd.rank() == 0 else None
    single_times: list[float] = []
    for p in pipelines:  # warm-up: traces every step function
        p.model.pipeline_gradients(x, y)
    if single is not None:
        single.time(x, y)

    for repeat in range(args.repeats):
        for p in pipelines if repeat % 2 == 0 else pipelines[::-1]:
            p.time(x, y, args.steps)
        sd.barrier(name="bench.single")
        # The other ranks wait in a point-to-point receive: its progress thread sleeps
        # after a short poll, where a rank waiting in a collective would spin on a core.
        if single is not None:
            single_times += [single.time(x, y) for _ in range(args.steps)]
            for peer in range(1, sd.size()):
                send([tf.zeros([1])], peer, tag=_TAG_SINGLE_DONE)
        else:
            recv([tf.float32], 0, tag=_TAG_SINGLE_DONE)

    single_seconds = statistics.median(single_times) if single_times else 0.0
    summaries: dict[str, dict] = {}
    for p in pipelines:
        stats = p.model._runner.stats
        mine = tf.constant([[statistics.median(p.bubbles), stats.peak_held, stats.peak_held_bytes,
                             statistics.median(p.times), p.held, p.build_peak]], tf.float64)
        everyone = sd.allgather(mine, name="bench.gather").numpy()
        if sd.rank() != 0:
            continue
        per_stage = everyone[:stages]
        step = float(np.max(everyone[:, 3]))
        ratio = round(step / single_seconds, 3)
        summaries.setdefault(p.schedule, {})[p.m] = ratio
        print(json.dumps({
            "schedule": p.schedule, "stages": stages, "data_parallel": sd.size() // stages, "microbatches": p.m,
            "batch_size": args.batch_size, "threads": args.threads,
            "step_seconds": round(step, 6),
            "single_process_seconds": round(single_seconds, 6),
            "over_single_process": ratio,
            "bubble_measured": [round(float(b), 3) for b in per_stage[:, 0]],
            "bubble_measured_mean": round(float(per_stage[:, 0].mean()), 3),
            "bubble_theory": round(schedule_lib.theoretical_bubble(stages, p.m), 3),
            "peak_microbatches": [int(v) for v in per_stage[:, 1]],
            "peak_activation_bytes": [int(v) for v in per_stage[:, 2]],
            "model_weight_bytes": p.full,
            "held_weight_bytes": [int(v) for v in per_stage[:, 4]],
            "build_peak_bytes": None if p.build_peak < 0 else [int(v) for v in per_stage[:, 5]],
        }), flush=True)
    for schedule, ratios in summaries.items():
        fewest, most = min(ratios), max(ratios)
        print(json.dumps({
            "summary": schedule, "stages": stages, "data_parallel": sd.size() // stages,
            "repeats": args.repeats, "steps": args.steps,
            "over_single_process": {str(m): r for m, r in sorted(ratios.items())},
            "most_over_fewest_microbatches": round(ratios[most] / ratios[fewest], 3),
        }), flush=True)


if __name__ == "__main__":
    main()
