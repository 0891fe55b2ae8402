"""Keras 2 (tf-keras with TF_USE_LEGACY_KERAS=1): DistributedOptimizer, the callbacks, DataParallelStrategy + fit, load_model.

tests/mp/suite_tf_keras.py runs on 2 and 4 real MPI ranks with ``TF_USE_LEGACY_KERAS=1`` set before
the ranks start (TensorFlow reads it when it is imported). This process stays on Keras 3.
"""

import pytest
import tensorflow as tf

import smdist_tf.keras as sk
from tests.mpi_harness import run_suite

tf_keras = pytest.importorskip("tf_keras")


@pytest.mark.parametrize("np", [2, 4])
def test_tf_keras_suite(np):
    run_suite("suite_tf_keras.py", np, timeout=600, env={"TF_USE_LEGACY_KERAS": "1", "SMDIST_STALL_SHUTDOWN_TIME": "60"})


class KerasThreeProcess(tf.test.TestCase):
    """In a Keras 3 process (this one), a tf_keras optimizer is refused with the way to switch."""

    def test_tf_keras_optimizer_needs_the_legacy_switch(self):
        with self.assertRaisesRegex(ValueError, "set TF_USE_LEGACY_KERAS=1"):
            sk.DistributedOptimizer(tf_keras.optimizers.Adam())
