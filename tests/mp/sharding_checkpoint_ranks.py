"""Saves a sharded model at one rank count, or resumes it at another: ``save DIR`` / ``resume DIR``.

Run by tests/test_sharding_multiprocess.py (2 -> 4 -> 2 ranks). Resuming loads the file
twice, into a sharded and an unsharded strategy, checks that the resharded state is the
saved state, trains both one more epoch and compares the weights; ``resume-and-save DIR``
then saves the sharded model over the file, for the next rank count to resume. A model
under parameter sharding (stage 3) takes the same path through its own file.
"""

from __future__ import annotations

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd

sd.init()
MODE, DIRECTORY = sys.argv[1], sys.argv[2]
PATH = os.path.join(DIRECTORY, "model.keras")
STAGE3_PATH = os.path.join(DIRECTORY, "stage3.keras")
RNG = np.random.default_rng(11)
DATA = tf.data.Dataset.from_tensor_slices((RNG.normal(size=(96, 7)).astype(np.float32),
                                           RNG.normal(size=(96, 1)).astype(np.float32))).batch(24)


def trained(strategy: sd.DataParallelStrategy) -> keras.Model:
    """The model both files start from, made in ``strategy``'s scope and trained one epoch."""
    with strategy.scope():
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(9, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01, amsgrad=True), loss="mse")
    model.fit(DATA, epochs=1, verbose=0)
    return model


def train_alike(sharded: keras.Model, unsharded: keras.Model) -> bool:
    """Trains both one more epoch; whether their weights then agree to 1e-5 (relative)."""
    for model in (sharded, unsharded):
        model.fit(DATA, epochs=1, verbose=0)
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
               for a, b in zip(sharded.get_weights(), unsharded.get_weights())) < 1e-5


def load(shard: bool) -> keras.Model:
    with sd.DataParallelStrategy(shard_optimizer_state=shard).scope():
        return keras.saving.load_model(PATH)


def load_stage3(shard: bool) -> keras.Model:
    with sd.DataParallelStrategy(shard_parameters=shard).scope():
        return keras.saving.load_model(STAGE3_PATH)


def resume_stage3() -> None:
    """Loads the stage-3 file sharded and unsharded, checks the weights, trains both an epoch and compares."""
    sharded, unsharded = load_stage3(True), load_stage3(False)
    loaded_equal = all(np.array_equal(a, b) for a, b in zip(sharded.get_weights(), unsharded.get_weights()))
    print(f"rank {sd.rank()}: stage 3 resumed at {sd.size()} ranks: weights equal {loaded_equal}, "
          f"trained match {train_alike(sharded, unsharded)}", flush=True)
    if MODE == "resume-and-save":
        sd.distribute.save_on_rank_zero(sharded, STAGE3_PATH)


if MODE == "save":
    sd.distribute.save_on_rank_zero(trained(sd.DataParallelStrategy(shard_optimizer_state=True)), PATH)
    sd.distribute.save_on_rank_zero(trained(sd.DataParallelStrategy(shard_parameters=True)), STAGE3_PATH)
    print(f"rank {sd.rank()}: saved at {sd.size()} ranks", flush=True)
else:
    resume_stage3()
    sharded, unsharded = load(True), load(False)
    with sd.sharding.gathered_state(sharded):
        gathered = sharded.optimizer.smdist_gather_state()
    full = [gathered.get(id(v), v.numpy()) for v in sharded.optimizer.variables]
    state_equal = all(np.array_equal(a, b.numpy()) for a, b in zip(full, unsharded.optimizer.variables))
    print(f"rank {sd.rank()}: resumed at {sd.size()} ranks: state equal {state_equal}, "
          f"weights match {train_alike(sharded, unsharded)}", flush=True)
    if MODE == "resume-and-save":
        sd.distribute.save_on_rank_zero(sharded, PATH)
        print(f"rank {sd.rank()}: saved at {sd.size()} ranks", flush=True)
