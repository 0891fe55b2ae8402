"""RayExecutor's costs, one run each, as JSON lines: the time from ``start()`` to the first
allreduce, and a Keras ``fit`` epoch under Ray against the same epoch under ``smdistrun``.

    python benchmarks/ray_executor.py              # a local Ray cluster, 2 ranks
    python benchmarks/ray_executor.py --np 4

``--fit-epoch`` is what each rank runs (under the executor, and under smdistrun).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def first_allreduce_at() -> float:
    """The wall-clock time at which this rank's first allreduce (TensorFlow op) returned."""
    import tensorflow as tf

    import smdist_tf as sd

    sd.init()
    sd.allreduce(tf.ones([4]), name="bench.first").numpy()
    return time.time()


def fit_epoch_seconds(epochs: int = 3) -> float:
    """Seconds of the last of ``epochs`` epochs (the first ones trace and warm up), on this rank."""
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    import smdist_tf as sd

    strategy = sd.DataParallelStrategy()
    keras.utils.set_random_seed(1)
    digits = load_digits()
    data = tf.data.Dataset.from_tensor_slices(((digits.data / 16.0).astype(np.float32), digits.target)).batch(
        64, drop_remainder=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                                  keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    starts: list[float] = []
    ends: list[float] = []
    timer = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: starts.append(time.perf_counter()),
                                           on_epoch_end=lambda e, logs: ends.append(time.perf_counter()))
    model.fit(data, epochs=epochs, verbose=0, shuffle=False, callbacks=[timer])
    return ends[-1] - starts[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--fit-epoch", action="store_true", help="run as a rank: print this rank's epoch time")
    args = parser.parse_args()
    if args.fit_epoch:
        print(json.dumps({"fit_epoch_s": fit_epoch_seconds()}), flush=True)
        return

    import ray

    from smdist_tf.ray import RayExecutor

    ray.init(address="local", num_cpus=args.np, include_dashboard=False, log_to_driver=False)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=args.np)
    started = time.time()
    executor.start()
    try:
        first = min(executor.run(first_allreduce_at))
        print(json.dumps({"metric": "start_to_first_allreduce_s", "np": args.np, "seconds": round(first - started, 2)}),
              flush=True)
        under_ray = executor.run(fit_epoch_seconds)[0]
    finally:
        executor.shutdown()
        ray.shutdown()
    done = subprocess.run([sys.executable, "-m", "smdist_tf.run", "-np", str(args.np), sys.executable, __file__,
                           "--fit-epoch"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        sys.exit(done.stdout[-2000:] + done.stderr[-2000:])
    under_smdistrun = json.loads(done.stdout.split("[0]<stdout>:", 1)[1].splitlines()[0])["fit_epoch_s"]
    print(json.dumps({"metric": "fit_epoch_s", "np": args.np, "ray": round(under_ray, 3),
                      "smdistrun": round(under_smdistrun, 3), "ray_over_smdistrun": round(under_ray / under_smdistrun, 3),
                      "load_average": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
