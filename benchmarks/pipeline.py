"""Pipeline-parallel step time, bubble fraction, activation and weight memory, GPipe vs 1F1B.

    smdistrun -np 2 python benchmarks/pipeline.py --microbatches 1 2 4 8

Prints one JSON line per (schedule, microbatches) on rank 0:
  step_seconds        median wall time of one training step (schedule + gradient sync)
  bubble_measured     per stage, the share of the schedule spent blocked in receives
  bubble_theory       (p - 1) / (m + p - 1)
  peak_microbatches   per stage, most microbatches of activations held at once
  peak_activation_bytes  per stage, bytes of stage inputs and outputs held at that peak
  model_weight_bytes  bytes of the whole model's weights
  held_weight_bytes   per stage, bytes of the weights its rank holds (built from a model function)
  build_peak_bytes    per stage, the CPU allocator's peak growth while the PipelineModel was built
                      (null if TensorFlow's BFC CPU allocator is off)
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
from smdist_tf.pipeline import schedule as schedule_lib  # noqa: E402


def build_model(width: int, depth: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--stages", type=int, default=0, help="default: all ranks")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    sd.init()
    stages = args.stages or sd.size()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch_size, args.width)).astype(np.float32)
    y = rng.integers(0, 10, args.batch_size)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for sched in args.schedules:
        for m in args.microbatches:
            try:
                base = tf.config.experimental.get_memory_info("CPU:0")["current"]
                tf.config.experimental.reset_memory_stats("CPU:0")
            except ValueError:  # the default (non-BFC) CPU allocator keeps no statistics
                base = None
            # Built from a function: each rank materialises its own stage's weights only.
            model = PipelineModel(lambda: build_model(args.width, args.depth), num_stages=stages, num_microbatches=m,
                                  schedule=sched, partition="uniform", verbose=False)
            build_peak = -1 if base is None else tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
            held = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.held_variables)
            full = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.unpartitioned.variables)
            model.compile(optimizer="sgd", loss=loss)
            model.pipeline_gradients(x, y)  # warm-up: traces the stage functions
            times, bubbles = [], []
            for _ in range(args.steps):
                sd.barrier(name="bench.step")
                start = time.perf_counter()
                model.pipeline_gradients(x, y)
                times.append(time.perf_counter() - start)
                stats = model._runner.stats
                bubbles.append(stats.waiting_seconds / max(stats.seconds, 1e-9))
            stats = model._runner.stats
            mine = tf.constant([[statistics.median(bubbles), stats.peak_held, stats.peak_held_bytes,
                                 statistics.median(times), held, build_peak]], tf.float64)
            everyone = sd.allgather(mine, name="bench.gather").numpy()
            if sd.rank() == 0:
                per_stage = everyone[:stages]
                print(json.dumps({
                    "schedule": sched, "stages": stages, "data_parallel": sd.size() // stages, "microbatches": m,
                    "batch_size": args.batch_size,
                    "step_seconds": round(float(np.max(everyone[:, 3])), 4),
                    "bubble_measured": [round(float(b), 3) for b in per_stage[:, 0]],
                    "bubble_measured_mean": round(float(per_stage[:, 0].mean()), 3),
                    "bubble_theory": round(schedule_lib.theoretical_bubble(stages, m), 3),
                    "peak_microbatches": [int(v) for v in per_stage[:, 1]],
                    "peak_activation_bytes": [int(v) for v in per_stage[:, 2]],
                    "model_weight_bytes": full,
                    "held_weight_bytes": [int(v) for v in per_stage[:, 4]],
                    "build_peak_bytes": None if base is None else [int(v) for v in per_stage[:, 5]],
                }), flush=True)


if __name__ == "__main__":
    main()
