"""A DistributedTestCase class that passes (examples/distributed_tests.py, run by the same test file, subclasses
its case for 4 ranks)."""

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf.testing import DistributedTestCase


class AllreduceOnTwoRanks(DistributedTestCase):
    np = 2

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.size_at_setup = sd.size()  # collectives work in setUpClass: init() ran first

    def setUp(self):
        super().setUp()
        self.ones = tf.ones([3]) * (sd.rank() + 1)

    def test_sum_equals_the_local_result(self):
        self.assertEqual(self.size_at_setup, self.np)
        expected = sum(np.ones(3) * (r + 1) for r in range(sd.size()))
        self.assertAllClose(sd.allreduce(self.ones, op=sd.Sum, name="kit.sum"), expected)

    def test_skipped_everywhere(self):
        self.skipTest("not on any rank")

    def test_broadcast_from_the_last_rank(self):
        out = sd.broadcast(tf.constant([float(sd.rank())]), root_rank=sd.size() - 1, name="kit.bcast")
        self.assertAllEqual(out, [float(sd.size() - 1)])


if __name__ == "__main__":
    tf.test.main()
