"""Pipeline-parallel Keras training on scikit-learn's digits.

    smdistrun -np 2 python examples/keras_pipeline_digits.py             # 2 stages
    smdistrun -np 4 python examples/keras_pipeline_digits.py --stages 2  # 2 stages x 2 replicas

Every rank passes the same model-building function and feeds the same data;
PipelineModel gives each rank only its own stage's weights and runs that stage, and
the loss and accuracy printed are global.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import smdist_tf as sd  # noqa: E402
from smdist_tf.keras import PipelineModel  # noqa: E402


class PrintEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if sd.rank() == 0:
            print(f"epoch {epoch + 1:3d}: loss {logs['loss']:.4f}  accuracy {logs['accuracy']:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--stages", type=int, default=0, help="pipeline stages (default: all ranks)")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    sd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    # The same split on every rank. Batches need not divide by microbatches x replicas:
    # the 1541 training samples end with a batch of 5, split into smaller microbatches.
    order = np.random.default_rng(0).permutation(len(x))
    train, test = order[:-256], order[-256:]

    def build_model() -> keras.Model:
        # Called on every rank; only this rank's stage gets weight values. Seeded, so
        # the weights are those of the same model built whole.
        keras.utils.set_random_seed(0)
        return keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ])

    pipeline = PipelineModel(build_model, num_stages=args.stages or sd.size(), num_microbatches=args.microbatches,
                             schedule=args.schedule)
    pipeline.compile(optimizer=keras.optimizers.Adam(0.005),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    pipeline.fit(x[train], y[train], batch_size=args.batch_size, epochs=args.epochs, shuffle=False, verbose=0,
                 callbacks=[PrintEpoch()])
    _, accuracy = pipeline.evaluate(x[test], y[test], batch_size=args.batch_size, verbose=0)
    if sd.rank() == 0:
        print(f"test accuracy: {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
