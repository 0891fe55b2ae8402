"""Process sets in training steps: gradients of the collectives on a set, and names that stay in step.

Run on every rank by tests/test_process_sets_multiprocess.py, in one job with the other suite_process_sets*.py;
tests/mp/process_set_setup.py registers the sets they share (even, odd, low, high, top, solo at 4 ranks).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.process_set_setup import ALL_SETS, my_sets

RANK, SIZE = sd.rank(), sd.size()
HANG_S = 90  # a test still running after this is hung (each takes seconds): end the job with the stack instead


class GradientTest(tf.test.TestCase):
    """Gradients run their collectives on the forward op's set. The expectations with an upstream
    gradient of ones are those of Horovod's test_tensorflow_process_sets.py."""

    @staticmethod
    def _grad(fn, x, upstream=None):
        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x, upstream).numpy()

    def test_allreduce_sum_grad_is_set_size_and_average_grad_ones(self):
        for ps in my_sets():
            for dtype in (np.float32, np.float64):
                x = np.full([5, 2], RANK, dtype)
                self.assertAllClose(self._grad(lambda t, ps=ps: sd.allreduce(t, op=sd.Sum, process_set=ps), x), np.full([5, 2], ps.size()))
                self.assertAllClose(self._grad(lambda t, ps=ps: sd.allreduce(t, op=sd.Average, process_set=ps), x), np.ones([5, 2]))
                grads = [self._grad(lambda t, ps=ps: sd.grouped_allreduce([t, 2 * t], op=sd.Sum, process_set=ps)[i], x)
                         for i in range(2)]
                self.assertAllClose(grads[0], np.full([5, 2], ps.size()))
                self.assertAllClose(grads[1], np.full([5, 2], 2 * ps.size()))

    def test_allreduce_grad_sums_the_members_upstream_gradients(self):
        # Rank r's loss weighs the result by r + 1: the gradient is the sum of the members' weights.
        for ps in my_sets():
            weights = sum(r + 1 for r in ps.ranks)

            @tf.function
            def grad(x, ps=ps):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(float(RANK + 1) * sd.allreduce(x, op=sd.Sum, process_set=ps))
                return tape.gradient(loss, x)

            self.assertAllClose(self._grad(lambda t, ps=ps: float(RANK + 1) * sd.allreduce(t, op=sd.Sum, process_set=ps),
                                           np.ones([3], np.float32)), [weights] * 3)
            self.assertAllClose(grad(tf.ones([3])), [weights] * 3)

    def test_allgather_grad_is_this_ranks_block(self):
        sizes = ([3, 2, 7, 4, 6, 8, 10] * 5)[:SIZE]
        for ps in my_sets():
            upstream = tf.concat([tf.fill([sizes[r], 4], float(r)) for r in ps.ranks], axis=0)
            g = self._grad(lambda t, ps=ps: sd.allgather(t, process_set=ps), np.ones([sizes[RANK], 4], np.float32), upstream)
            self.assertAllClose(g, np.full([sizes[RANK], 4], float(RANK)))

    def test_broadcast_grad_is_ones_on_the_root(self):
        for ps in my_sets():
            for root in ps.ranks:
                g = self._grad(lambda t, ps=ps, root=root: sd.broadcast(t, root, process_set=ps), np.full([5], RANK, np.float32))
                self.assertAllClose(g, np.full([5], 1.0 if RANK == root else 0.0))

    def test_broadcast_grad_in_tf_function_runs_on_every_member(self):
        # The members but the root discard the averaged gradient; they must still take part in it.
        for ps in my_sets():
            root = ps.ranks[-1]
            weights = sum(r + 1 for r in ps.ranks) / ps.size()

            @tf.function
            def grad(x, ps=ps, root=root):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(float(RANK + 1) * sd.broadcast(x, root, process_set=ps))
                return tape.gradient(loss, x)

            for _ in range(2):
                self.assertAllClose(grad(tf.ones([3])), [weights if RANK == root else 0.0] * 3)

    def test_alltoall_grad_is_ones(self):
        for ps in my_sets():
            n = ps.size()
            x = np.repeat(np.arange(n, dtype=np.float32), RANK + 1)[:, None] * np.ones([1, 2], np.float32)
            g = self._grad(lambda t, ps=ps: sd.alltoall(t, splits=[RANK + 1] * n, process_set=ps)[0], x)
            self.assertAllClose(g, np.ones_like(x))
            # Rank-dependent upstream: row block j goes to member j, whose weight is its rank + 1.
            g = self._grad(lambda t, ps=ps: sd.alltoall(t, process_set=ps), np.ones([n, 2], np.float32),
                           tf.fill([n, 2], float(RANK + 1)))
            self.assertAllClose(g, np.repeat(np.array(ps.ranks, np.float32)[:, None] + 1, 2, axis=1))

    def test_reducescatter_grad_is_set_size_for_sum_and_ones_for_average(self):
        for ps in my_sets():
            n = ps.size()
            x = np.full([n * 4, 3], RANK, np.float32)
            upstream = tf.ones([4, 3])
            g = self._grad(lambda t, ps=ps: sd.reducescatter(t, op=sd.Sum, process_set=ps), x, upstream)
            self.assertAllClose(g, np.full([n * 4, 3], n))
            g = self._grad(lambda t, ps=ps: sd.reducescatter(t, op=sd.Average, process_set=ps), x, upstream)
            self.assertAllClose(g, np.ones([n * 4, 3]))


class NamesStayInStepTest(tf.test.TestCase):
    def _unnamed_round(self, ps, k):
        self.assertAllClose(sd.allreduce(tf.constant([float(RANK + k)]), op=sd.Sum, process_set=ps),
                            [sum(r + k for r in ps.ranks)])
        self.assertAllEqual(sd.allgather(tf.constant([RANK + k]), process_set=ps), [r + k for r in ps.ranks])
        self.assertAllEqual(sd.broadcast(tf.constant([RANK]), ps.ranks[-1], process_set=ps), [ps.ranks[-1]])
        self.assertAllEqual(sd.alltoall(tf.fill([ps.size()], RANK), process_set=ps), ps.ranks)
        self.assertAllClose(sd.reducescatter(tf.fill([ps.size()], float(RANK)), op=sd.Sum, process_set=ps),
                            [sum(ps.ranks)])
        sd.barrier(process_set=ps)

    def test_unnamed_calls_made_a_different_number_of_times_on_each_set(self):
        # Set i's members make i + 1 rounds of unnamed calls on it, so the ranks have made different
        # numbers of unnamed calls of each kind before the global ones, and after them.
        for attempt in range(2):
            for i, ps in enumerate(ALL_SETS):
                if ps.included():
                    for k in range(i + 1):
                        self._unnamed_round(ps, k)
            self._unnamed_round(sd.global_process_set, attempt)
            self.assertAllClose(sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum), [sum(range(SIZE))])
            self.assertAllEqual(sd.allgather(tf.constant([RANK])), list(range(SIZE)))
            sd.barrier()


if __name__ == "__main__":
    tf.test.main()
