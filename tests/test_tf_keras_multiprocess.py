"""Keras 2 (tf-keras with TF_USE_LEGACY_KERAS=1): DistributedOptimizer, the callbacks, DataParallelStrategy + fit, load_model.

tests/mp/suite_tf_keras.py runs on 2 real MPI ranks with ``TF_USE_LEGACY_KERAS=1`` set before the ranks
start (TensorFlow reads it when it is imported). This process stays on Keras 3. Not at 4 ranks as well: Keras 2
reaches the same gradient reducer and collectives as Keras 3, whose suites run at 2 and 4 ranks, and its
tests compare with one process at the global batch, which no rank count changes; a 4-rank job of its own would
cost the CI machine another 50 s.
"""

import pytest
import tensorflow as tf

import smdist_tf.keras as sk
from tests.mpi_harness import run_suite

tf_keras = pytest.importorskip("tf_keras")


def test_tf_keras_suite():
    run_suite("suite_tf_keras.py", 2, timeout=600, env={"TF_USE_LEGACY_KERAS": "1", "SMDIST_STALL_SHUTDOWN_TIME": "60"})


class KerasThreeProcess(tf.test.TestCase):
    """In a Keras 3 process (this one), a tf_keras optimizer is refused with the way to switch."""

    def test_tf_keras_optimizer_needs_the_legacy_switch(self):
        with self.assertRaisesRegex(ValueError, "set TF_USE_LEGACY_KERAS=1"):
            sk.DistributedOptimizer(tf_keras.optimizers.Adam())
