"""Data-parallel Keras ``fit`` on a Ray cluster with ``smdist_tf.ray.RayExecutor``.

``train`` is an ordinary smdist_tf training function (it runs as it is under
``smdistrun``); the executor runs it on every rank, each rank an MPI process of the
engine on a Ray actor's node, and returns what every rank returned. Run with:

    python examples/ray_keras.py                  # a local Ray cluster of 2 CPUs, 2 ranks
    RAY_ADDRESS=head:6379 python examples/ray_keras.py --num-workers 8   # an existing cluster
"""

from __future__ import annotations

import argparse


def train(epochs: int = 2, save_weights: str | None = None) -> dict:
    """Trains a small classifier on scikit-learn's digits under ``DataParallelStrategy``.

    Returns:
        This rank's ``rank``, ``size``, ``local_rank``, ``local_size``, final ``loss`` and ``weights``.
    """
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    import smdist_tf as sd

    strategy = sd.DataParallelStrategy()  # initialises smdist_tf
    keras.utils.set_random_seed(1234 + sd.rank())  # the strategy broadcasts rank 0's initial weights
    digits = load_digits()
    x, y = (digits.data[:512] / 16.0).astype(np.float32), digits.target[:512].astype(np.int64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)  # 64: the global batch
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(3e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(data, epochs=epochs, verbose=0, shuffle=False)
    weights = [np.asarray(w) for w in model.get_weights()]
    if save_weights and sd.rank() == 0:
        np.savez(save_weights, *weights)
    return {"rank": sd.rank(), "size": sd.size(), "local_rank": sd.local_rank(), "local_size": sd.local_size(),
            "loss": float(history.history["loss"][-1]), "weights": weights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-weights", help="rank 0 saves the trained weights here (.npz)")
    args = parser.parse_args()

    import ray

    from smdist_tf.ray import RayExecutor

    ray.init()  # joins the cluster at RAY_ADDRESS, else starts a local one
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.num_workers, cpus_per_worker=1)
    executor.start()
    try:
        results = executor.run(train, kwargs={"epochs": args.epochs, "save_weights": args.save_weights})
    finally:
        executor.shutdown()
    for r in results:
        print(f"rank {r['rank']}/{r['size']}: local rank {r['local_rank']}/{r['local_size']}, loss {r['loss']:.4f}")


if __name__ == "__main__":
    main()
