"""DistributedTestCase classes that fail on some ranks, raise, or hang (run by tests/test_testing_kit.py)."""

import time

import tensorflow as tf

import smdist_tf as sd
from smdist_tf.testing import DistributedTestCase


class FailsOnSomeRanks(DistributedTestCase):
    np = 2
    timeout = 30

    def test_assertion_on_rank_one(self):
        self.assertEqual(sd.rank(), 0, "only rank 0 gets here unhurt")

    def test_exception_on_rank_zero(self):
        if sd.rank() == 0:
            raise ValueError("rank zero gives up")

    def test_passes(self):
        self.assertEqual(sd.size(), 2)


class HangsOnRankOne(DistributedTestCase):
    np = 2
    timeout = 8

    def test_a_hang(self):
        if sd.rank() == 1:
            time.sleep(3600)
        sd.allreduce(tf.ones([1]), name="kit.never")  # rank 0 waits for rank 1 in vain

    def test_b_after_the_hang(self):
        pass


class StuckInSetUpClass(DistributedTestCase):
    np = 2
    startup_timeout = 6

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if sd.rank() == 0:
            time.sleep(3600)

    def test_never_reached(self):
        pass


if __name__ == "__main__":
    tf.test.main()
