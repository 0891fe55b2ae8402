"""Assertions multi-rank suites make together on every rank."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import smdist_tf as sd


class SyncAssertions(tf.test.TestCase):
    def assert_identical_on_all_ranks(self, values: np.ndarray) -> None:
        """Bit-identical, not merely close."""
        everyone = sd.allgather(tf.reshape(tf.constant(values), [1, -1])).numpy()
        for r in range(sd.size()):
            self.assertAllEqual(everyone[r], values, msg=f"rank {r} differs from rank {sd.rank()}")

    def assert_engine_healthy(self) -> None:
        size = sd.size()
        self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name=f"healthy.{self.id()}"), [size, size])
