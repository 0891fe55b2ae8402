"""Keras ``fit`` with the optimizer state sharded over the ranks (ZeRO stage 1, or 2 with ``--stage 2``).

``DataParallelStrategy(shard_optimizer_state=True)`` makes every Keras optimizer
created in its scope keep its slots (Adam's two moments here) for this rank's
1/N of each variable only. Each step reduce-scatters the gradients, updates this
rank's pieces and allgathers the updated weights (see docs/sharding.md).
``--stage 2`` adds ``shard_gradients=True`` and trains with
``gradient_accumulation_steps=2``: the accumulation buffers are sharded too.

The script trains a small MLP on synthetic data, prints each rank's optimizer-state
bytes next to what the unsharded optimizer would hold, saves the model with
``save_on_rank_zero`` (the file holds the full, gathered state), loads it into a
fresh model on every rank, checks that training on from the loaded model matches
training on from the original step for step, and that every rank holds the same
weights. Run with:

    smdistrun -np 2 python examples/keras_sharded.py
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd

FEATURES, CLASSES = 32, 4


def synthetic_data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The same data on every rank: labels from a random linear teacher (the strategy shards it)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, FEATURES)).astype(np.float32)
    teacher = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
    return x, np.argmax(x @ teacher, axis=1).astype(np.int64)


def make_model(hidden: int, accumulation_steps: int | None) -> keras.Model:
    """Built and compiled: call inside the strategy's scope."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    optimizer = keras.optimizers.Adam(1e-3, gradient_accumulation_steps=accumulation_steps)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def nbytes(variables: list) -> int:
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)


def state_bytes(model: keras.Model) -> tuple[int, int]:
    """(bytes of optimizer state on this rank, bytes the unsharded optimizer holds for the same model).

    The unsharded optimizer has, per trainable variable, slots of the variable's full
    shape (Adam: two; plus gradient accumulators with accumulation); the scalars
    (iteration, learning rate) are the same either way.
    """
    optimizer = model.optimizer
    scalars = [v for v in optimizer.variables if len(v.shape) == 0]
    per_variable = (len(optimizer.variables) - len(scalars)) // len(model.trainable_variables)
    return nbytes(optimizer.variables), nbytes(scalars) + per_variable * nbytes(model.trainable_variables)


def flat_weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", type=int, choices=[1, 2], default=1,
                        help="1: shard the optimizer state; 2: shard the gradient-accumulation buffers too")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()

    stage2 = args.stage == 2
    strategy = sd.DataParallelStrategy(shard_optimizer_state=True, shard_gradients=stage2)
    rank, size = sd.rank(), sd.size()
    tag = f"[rank {rank}]"
    accumulation = 2 if stage2 else None

    x, y = synthetic_data(args.samples)
    with strategy.scope():
        model = make_model(args.hidden, accumulation)
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=False,
                        verbose=2 if rank == 0 else 0)
    for epoch, (loss, accuracy) in enumerate(zip(history.history["loss"], history.history["accuracy"]), 1):
        print(f"{tag} epoch {epoch}: loss {loss:.4f} accuracy {accuracy:.4f}", flush=True)

    here, full = state_bytes(model)
    params = model.count_params()
    print(f"{tag} stage {args.stage}, {size} ranks, {params} parameters ({nbytes(model.trainable_variables)} bytes, "
          f"on every rank): optimizer state {here} bytes on this rank, {full} bytes unsharded "
          f"({here / full:.2f} of it)", flush=True)

    # Save: every rank calls it; the slots are gathered and rank 0 writes the full state.
    directory = sd.broadcast_object(tempfile.mkdtemp(prefix="keras_sharded_") if rank == 0 else None)
    path = f"{directory}/model.weights.h5"
    sd.distribute.save_on_rank_zero(model, path)

    # Load on every rank into a fresh model; each rank keeps its own piece of every slot.
    with strategy.scope():
        restored = make_model(args.hidden, accumulation)
        restored.optimizer.build(restored.trainable_variables)  # a sharded optimizer loads once built
    restored.load_weights(path)
    sd.barrier()
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    same_weights = np.array_equal(flat_weights(model), flat_weights(restored))
    same_state = all(np.array_equal(a.numpy(), b.numpy())
                     for a, b in zip(model.optimizer.variables, restored.optimizer.variables))
    print(f"{tag} reloaded {path.rsplit('/', 1)[1]}: weights equal {same_weights}, "
          f"this rank's optimizer state equal {same_state}", flush=True)

    # Train one more epoch from both: the same state gives the same next steps.
    for m in (model, restored):
        m.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0)
    resumed = np.array_equal(flat_weights(model), flat_weights(restored))
    print(f"{tag} one more epoch from the original and from the reloaded model: identical {resumed}", flush=True)

    # Every rank must hold the same weights.
    rows = sd.allgather(tf.constant(flat_weights(restored))[tf.newaxis]).numpy()
    identical = bool((rows == rows[0]).all())
    print(f"{tag} weights identical across ranks: {identical}", flush=True)
    verdicts = sd.allreduce(tf.constant([int(identical and same_weights and same_state and resumed)]), op=sd.Sum)
    if rank == 0:
        print(f"all {size} ranks: {int(verdicts[0])} report identical weights and a complete checkpoint", flush=True)


if __name__ == "__main__":
    main()
