"""Testing your own training code on several ranks with smdist_tf.testing.

The property a data-parallel step must keep: with every rank on its own slice of a
global batch, the gradients DistributedGradientTape averages equal the gradients of
the whole global batch computed in one process, and one optimizer step leaves the
weights identical on every rank. Run with any of:

    python examples/distributed_tests.py
    python -m pytest examples/distributed_tests.py
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf.testing import DistributedTestCase

GLOBAL_BATCH = 64


def make_model() -> keras.Model:
    keras.utils.set_random_seed(7)  # the same initial weights on every rank
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


def global_batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(GLOBAL_BATCH, 8)).astype(np.float32), rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)


def gradients(model: keras.Model, x: np.ndarray, y: np.ndarray) -> list[tf.Tensor]:
    """Of the mean squared error, in this process alone."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    return tape.gradient(loss, model.trainable_variables)


class DataParallelStepTest(DistributedTestCase):
    np = 2
    timeout = 120

    def setUp(self):
        super().setUp()
        self.x, self.y = global_batch()
        per_rank = GLOBAL_BATCH // sd.size()
        self.mine = slice(sd.rank() * per_rank, (sd.rank() + 1) * per_rank)

    def test_averaged_gradients_equal_the_global_batch_gradients(self):
        model = make_model()
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(self.x[self.mine]) - self.y[self.mine]))
        averaged = sd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        for got, want in zip(averaged, gradients(make_model(), self.x, self.y)):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    def test_one_step_keeps_the_weights_identical_on_every_rank(self):
        model = make_model()
        optimizer = keras.optimizers.SGD(0.1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(self.x[self.mine]) - self.y[self.mine]))
        grads = sd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        for w in model.trainable_variables:
            everyone = sd.allgather(tf.reshape(w, [1, -1]), name=f"weights.{w.path}").numpy()
            for r in range(sd.size()):
                self.assertAllEqual(everyone[r], everyone[0], msg=f"rank {r} differs from rank 0 in {w.path}")


class DataParallelStepOnFourRanks(DataParallelStepTest):
    np = 4


if __name__ == "__main__":
    tf.test.main()
