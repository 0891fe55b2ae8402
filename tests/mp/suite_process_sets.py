"""Process sets: collectives among a subset of the ranks, against locally computed expectations.

Run on every rank by tests/test_process_sets_multiprocess.py, at 2 and 4 ranks. The module
registers static sets with ``init(process_sets=[...])`` (conftest.py has started the engine
without sets). At 4 ranks they are even [0, 2], odd [1, 3], low [0, 1], high [1, 2, 3]
(which overlaps low and odd), top [2, 3] (disjoint from low) and solo [3]; at 2 ranks every
subset but the singletons [0] and [1] repeats the global set, which cannot be registered twice.

Each rank runs a test's collectives on the sets it belongs to, in the order of ``ALL_SETS``
(one order for every rank, so blocking calls on overlapping sets cannot wait on each other in
a cycle). Inputs depend on the rank and the set, so a collective that ran on the wrong ranks
gives a wrong result rather than a lucky right one.

RegistrationTest restarts the engine with dynamic sets before each test and
restores the static sets afterwards. One test is an expected failure, for the library bug
named there: unnamed calls on a set whose id an earlier engine (before shutdown()/init())
gave another set.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp import rank_guards
from tests.mp.engine_restart import restart_engine
from smdist_tf import process_sets as _process_sets
from smdist_tf._native import runtime as _rt
from tests.mp.collective_expectations import (
    MOVABLE,
    REDUCE_OPS,
    REDUCIBLE,
    expected_reduction,
    rank_values,
    tolerance,
)

RANK, SIZE = sd.rank(), sd.size()
HANG_S = 90  # a test still running after this is hung (each takes seconds): end the job with the stack instead
DELAY_S = 0.25  # long enough for the other members to be waiting
SLOW_S = 2.0  # how long the members of one set stay away while another set works


def _static_set_ranks() -> dict:
    if SIZE >= 4:
        return {
            "even": list(range(0, SIZE, 2)),
            "odd": list(range(1, SIZE, 2)),
            "low": [0, 1],
            "high": list(range(1, SIZE)),
            "top": [SIZE - 2, SIZE - 1],
            "solo": [SIZE - 1],
        }
    # At 2 ranks any other subset has the global set's ranks: a set may not repeat them.
    return {f"only{r}": [r] for r in range(SIZE)}


SETS = {name: sd.ProcessSet(ranks) for name, ranks in _static_set_ranks().items()}
ALL_SETS = list(SETS.values())
sd.init(process_sets=ALL_SETS)
STATIC_IDS = {name: ps.process_set_id for name, ps in SETS.items()}

# Two sets without a common rank that together hold every rank, and (at 4 ranks) two that share rank 1.
DISJOINT = (SETS["low"], SETS["top"]) if SIZE >= 4 else (SETS["only0"], SETS["only1"])
# Sets registered by the dynamic tests: at 4 ranks they overlap; at 2 the singletons.
DYNAMIC_RANKS = [[0, 2], [1, 2, 3]] if SIZE >= 4 else [[0], [1]]


def my_sets() -> list:
    return [ps for ps in ALL_SETS if ps.included()]


def other_sets() -> list:
    return [ps for ps in ALL_SETS if not ps.included()]


def set_values(ps, shape, dtype, op=sd.Sum, seed=0) -> list:
    """Each member's input (in member order); other sets get other inputs."""
    return [rank_values(r, shape, dtype, op, seed * 101 + ps.process_set_id) for r in ps.ranks]


def as_f64(t) -> np.ndarray:
    return tf.cast(t, tf.float64).numpy() if t.dtype != tf.bool else t.numpy()


def block_of(rows: int, n: int, index: int) -> slice:
    """The rows of dimension 0 member ``index`` of ``n`` gets from reducescatter."""
    start = sum(rows // n + (i < rows % n) for i in range(index))
    return slice(start, start + rows // n + (index < rows % n))


def restart(process_sets=None, **env: str) -> None:
    """Restarts the engine on every rank with ``process_sets`` and extra settings ('' removes one)."""
    if sd.is_initialized():
        # shutdown() fails every rank's pending collectives, on any set: wait until all are done
        # (a rank may still be in a collective on a set of its own while another comes here).
        sd.barrier()
    restart_engine(process_sets, **env)


def _root(ps) -> int:
    return ps.ranks[0] if isinstance(ps, sd.ProcessSet) and ps.ranks else 0


def _variables_broadcast(ps, n):
    var = tf.Variable(tf.ones([2]))
    sd.broadcast_variables([var], _root(ps), process_set=ps)
    return var


# Every collective with process_set=, and inputs any member may pass (n: members of the set).
COLLECTIVES = {
    "allreduce": lambda ps, n: sd.allreduce(tf.ones([4]), op=sd.Sum, process_set=ps),
    "grouped_allreduce": lambda ps, n: sd.grouped_allreduce([tf.ones([4]), tf.ones([2], tf.int32)], op=sd.Sum, process_set=ps),
    "allgather": lambda ps, n: sd.allgather(tf.ones([2, 3]), process_set=ps),
    "grouped_allgather": lambda ps, n: sd.grouped_allgather([tf.ones([2]), tf.zeros([1], tf.int64)], process_set=ps),
    "broadcast": lambda ps, n: sd.broadcast(tf.ones([3]), _root(ps), process_set=ps),
    "grouped_broadcast": lambda ps, n: sd.grouped_broadcast([tf.ones([3]), tf.ones([1], tf.bool)], _root(ps), process_set=ps),
    "alltoall": lambda ps, n: sd.alltoall(tf.ones([2 * n, 2]), process_set=ps),
    "alltoall_splits": lambda ps, n: sd.alltoall(tf.ones([n, 2]), splits=[1] * n, process_set=ps),
    "reducescatter": lambda ps, n: sd.reducescatter(tf.ones([2 * n, 2]), op=sd.Sum, process_set=ps),
    "grouped_reducescatter": lambda ps, n: sd.grouped_reducescatter([tf.ones([n, 2])], op=sd.Sum, process_set=ps),
    "barrier": lambda ps, n: sd.barrier(process_set=ps),
}
# Variables cannot be created inside tf.function on every call: eager only.
EAGER_ONLY = {"broadcast_variables": _variables_broadcast}


_report_failures_at_once, _fail_instead_of_hanging = rank_guards.fixtures(RANK, SIZE, HANG_S, "suite_process_sets")


class MembershipTest(tf.test.TestCase):
    def test_ids_ranks_size_rank_and_included(self):
        ids = [ps.process_set_id for ps in ALL_SETS]
        self.assertTrue(all(isinstance(i, int) and i > 0 for i in ids), ids)
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(sorted(_rt.process_set_ids()), sorted([0] + ids))
        for name, ranks in _static_set_ranks().items():
            ps = SETS[name]
            self.assertEqual(ps.ranks, ranks)
            self.assertEqual(ps.size(), len(ranks))
            self.assertEqual(ps.rank(), ranks.index(RANK) if RANK in ranks else -1)
            self.assertEqual(ps.included(), RANK in ranks)
            self.assertIs(_process_sets.process_set_by_id(ps.process_set_id), ps)
        glob = sd.global_process_set
        self.assertEqual((glob.process_set_id, glob.ranks, glob.size(), glob.rank(), glob.included()),
                         (0, list(range(SIZE)), SIZE, RANK, True))
        # Every rank registered the same sets under the same ids.
        everyone = sd.allgather(tf.constant([ids]), name="ps.ids").numpy()
        for r in range(SIZE):
            self.assertAllEqual(everyone[r], ids, msg=f"rank {r}")

    def test_unregistered_set_has_no_size_rank_or_membership(self):
        ps = sd.ProcessSet([0])
        self.assertIsNone(ps.process_set_id)
        self.assertEqual((ps.size(), ps.rank(), ps.included()), (None, None, None))
        self.assertEqual(sd.ProcessSet([3, 1, 2]).ranks, [1, 2, 3])
        with self.assertRaisesRegex(ValueError, "list of integer ranks"):
            sd.ProcessSet(["0"])

    def test_size_op_and_process_set_included_op(self):
        sets = [sd.global_process_set] + ALL_SETS
        graph = tf.function(lambda: [(sd.size_op(process_set_id=ps.process_set_id),
                                      sd.process_set_included_op(process_set_id=ps.process_set_id)) for ps in sets])
        for ps, (size, included) in zip(sets, graph()):
            with self.subTest(set=ps.ranks):
                self.assertEqual(int(size), ps.size())
                self.assertEqual(int(included), int(ps.included()))
                self.assertEqual(int(sd.size_op(process_set_id=ps.process_set_id)), ps.size())
                self.assertEqual(int(sd.process_set_included_op(process_set_id=ps.process_set_id)), int(ps.included()))
        unknown = max(_rt.process_set_ids()) + 100
        for op in (sd.size_op, sd.process_set_included_op):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "not registered"):
                op(process_set_id=unknown)

    def test_global_process_set_is_every_rank(self):
        out = sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum, process_set=sd.global_process_set)
        self.assertAllClose(out, [sum(range(SIZE))])
        self.assertAllEqual(sd.allgather(tf.constant([RANK]), process_set=sd.global_process_set), list(range(SIZE)))


class AllreduceTest(tf.test.TestCase):
    def test_every_dtype_and_op_eager(self):
        for ps in my_sets():
            for dtype in REDUCIBLE:
                for op in REDUCE_OPS:
                    for shape in [(), (2, 3)]:
                        with self.subTest(set=ps.ranks, dtype=dtype.name, op=op, shape=shape):
                            values = set_values(ps, shape, dtype, op, seed=len(shape))
                            out = sd.allreduce(tf.constant(values[ps.rank()], dtype), op=op, process_set=ps)
                            self.assertEqual(out.dtype, dtype)
                            self.assertEqual(tuple(out.shape), shape)
                            self.assertAllClose(as_f64(out), expected_reduction(values, op, dtype), **tolerance(dtype))

    def test_every_dtype_and_op_in_tf_function(self):
        combos = [(dtype, op) for dtype in REDUCIBLE for op in REDUCE_OPS]
        for ps in my_sets():
            values = [set_values(ps, (3, 2), dtype, op, seed=7) for dtype, op in combos]
            step = tf.function(lambda xs, ps=ps: [sd.allreduce(x, op=op, process_set=ps) for x, (_, op) in zip(xs, combos)])
            outs = step([tf.constant(v[ps.rank()], dtype) for v, (dtype, _) in zip(values, combos)])
            for out, v, (dtype, op) in zip(outs, values, combos):
                with self.subTest(set=ps.ranks, dtype=dtype.name, op=op):
                    self.assertEqual(out.dtype, dtype)
                    self.assertAllClose(as_f64(out), expected_reduction(v, op, dtype), **tolerance(dtype))

    def test_prescale_postscale_and_compression(self):
        for ps in my_sets():
            for dtype in (tf.float32, tf.float16, tf.int32):
                for op in (sd.Sum, sd.Average):
                    with self.subTest(set=ps.ranks, dtype=dtype.name, op=op):
                        values = set_values(ps, (6,), dtype, op, seed=2)
                        out = sd.allreduce(tf.constant(values[ps.rank()], dtype), op=op, prescale_factor=0.5,
                                           postscale_factor=3.0, process_set=ps)
                        expected = expected_reduction(values, op, dtype, prescale=0.5, postscale=3.0)
                        self.assertAllClose(as_f64(out), expected, **tolerance(dtype))
            values = set_values(ps, (64,), tf.float32, seed=3)
            out = sd.allreduce(tf.constant(values[ps.rank()]), op=sd.Average, compression=sd.Compression.fp16, process_set=ps)
            self.assertEqual(out.dtype, tf.float32)
            self.assertAllClose(out, expected_reduction(values, sd.Average, tf.float32), rtol=3e-2, atol=3e-2)

    def test_grouped_allreduce_mixed_dtypes_eager_and_in_tf_function(self):
        dtypes = [tf.float32, tf.int32, tf.float16, tf.bfloat16, tf.int64, tf.float64, tf.uint8]
        for ps in my_sets():
            values = [set_values(ps, (i + 1, 3), dt, seed=10 + i) for i, dt in enumerate(dtypes)]
            inputs = [tf.constant(v[ps.rank()], dt) for v, dt in zip(values, dtypes)]
            runs = [(sd.Average, lambda ts, ps=ps: sd.grouped_allreduce(ts, process_set=ps)),
                    (sd.Sum, tf.function(lambda ts, ps=ps: sd.grouped_allreduce(ts, op=sd.Sum, process_set=ps)))]
            for op, run in runs:
                outs = run(inputs)
                for out, v, dt in zip(outs, values, dtypes):
                    with self.subTest(set=ps.ranks, op=op, dtype=dt.name):
                        self.assertEqual(out.dtype, dt)
                        self.assertAllClose(as_f64(out), expected_reduction(v, op, dt), **tolerance(dt))

    def test_large_tensors(self):
        # Large enough for the paths that skip the fusion buffer (shared memory between the members).
        n = 1 << 20
        for ps in my_sets():
            total = sum(r + 1 for r in ps.ranks)
            x = tf.fill([n], float(RANK + 1))
            self.assertAllEqual(sd.allreduce(x, op=sd.Sum, process_set=ps), np.full([n], total, np.float32))
            chain = tf.function(lambda t, ps=ps: sd.allreduce(sd.allreduce(t, op=sd.Sum, process_set=ps), op=sd.Sum,
                                                              process_set=ps))
            self.assertAllEqual(chain(x), np.full([n], total * ps.size(), np.float32))


class AllgatherTest(tf.test.TestCase):
    def test_every_dtype_with_uneven_first_dimension(self):
        # Rank r contributes r % 3 rows: rank 0 none.
        for ps in my_sets():
            values = {d: [rank_values(r, (r % 3, 2), d, seed=ps.process_set_id) for r in ps.ranks] for d in MOVABLE}
            for dtype in MOVABLE:
                with self.subTest(set=ps.ranks, dtype=dtype.name):
                    out = sd.allgather(tf.constant(values[dtype][ps.rank()], dtype), process_set=ps)
                    self.assertEqual(out.dtype, dtype)
                    self.assertAllEqual(out.numpy(), np.concatenate(values[dtype]))
            graph = tf.function(lambda xs, ps=ps: [sd.allgather(x, process_set=ps) for x in xs])
            outs = graph([tf.constant(values[d][ps.rank()], d) for d in MOVABLE])
            for out, dtype in zip(outs, MOVABLE):
                with self.subTest(set=ps.ranks, dtype=dtype.name, graph=True):
                    self.assertEqual(out.dtype, dtype)
                    self.assertAllEqual(out.numpy(), np.concatenate(values[dtype]))

    def test_scalar_becomes_vector_and_grouped_allgather(self):
        for ps in my_sets():
            self.assertAllEqual(sd.allgather(tf.constant(RANK), process_set=ps), ps.ranks)
            outs = sd.grouped_allgather([tf.fill([RANK + 1], RANK), tf.constant([[RANK > 0, True]])], process_set=ps)
            self.assertAllEqual(outs[0], np.concatenate([np.full([r + 1], r) for r in ps.ranks]))
            self.assertAllEqual(outs[1], [[r > 0, True] for r in ps.ranks])


class BroadcastTest(tf.test.TestCase):
    def test_every_dtype_from_every_member_root(self):
        for ps in my_sets():
            for dtype in MOVABLE:
                values = {r: rank_values(r, (3, 2), dtype, seed=ps.process_set_id) for r in ps.ranks}
                for root in ps.ranks:
                    with self.subTest(set=ps.ranks, dtype=dtype.name, root=root):
                        out = sd.broadcast(tf.constant(values[RANK], dtype), root, process_set=ps)
                        self.assertEqual(out.dtype, dtype)
                        self.assertAllEqual(out.numpy(), values[root])

    def test_every_member_root_in_tf_function(self):
        dtypes = [tf.float32, tf.int64, tf.bool, tf.bfloat16]
        for ps in my_sets():
            values = {d: {r: rank_values(r, (4,), d, seed=ps.process_set_id + 1) for r in ps.ranks} for d in dtypes}
            graph = tf.function(lambda xs, ps=ps: [[sd.broadcast(x, root, process_set=ps) for x in xs] for root in ps.ranks])
            outs = graph([tf.constant(values[d][RANK], d) for d in dtypes])
            for root, row in zip(ps.ranks, outs):
                for out, d in zip(row, dtypes):
                    with self.subTest(set=ps.ranks, root=root, dtype=d.name):
                        self.assertAllEqual(out.numpy(), values[d][root])

    def test_grouped_broadcast_broadcast_variables_and_broadcast_(self):
        import keras

        for ps in my_sets():
            root = ps.ranks[-1]
            outs = sd.grouped_broadcast([tf.fill([2], float(RANK)), tf.constant([RANK, -RANK])], root, process_set=ps)
            self.assertAllEqual(outs[0], [root] * 2)
            self.assertAllEqual(outs[1], [root, -root])

            tf_var = tf.Variable(tf.fill([3], float(RANK)))
            keras_var = keras.Variable(np.full([2, 2], RANK, np.float32))
            int_var = tf.Variable(RANK + 10)
            self.assertIsNone(sd.broadcast_variables([tf_var, keras_var, int_var], root_rank=root, process_set=ps))
            self.assertAllEqual(tf_var.numpy(), [root] * 3)
            self.assertAllEqual(keras_var.numpy(), np.full([2, 2], root))
            self.assertEqual(int_var.numpy(), root + 10)

            var = tf.Variable(tf.fill([2], float(RANK)))
            self.assertIs(sd.broadcast_([var], root_rank=ps.ranks[0], process_set=ps)[0], var)
            self.assertAllEqual(var.numpy(), [ps.ranks[0]] * 2)

            graph_var = tf.Variable(tf.fill([4], float(RANK)))
            @tf.function
            def sync(ps=ps, root=root):
                sd.broadcast_variables([graph_var], root_rank=root, process_set=ps)

            sync()
            self.assertAllEqual(graph_var.numpy(), [root] * 4)


class AlltoallTest(tf.test.TestCase):
    def test_default_splits_every_dtype(self):
        for ps in my_sets():
            n, me = ps.size(), ps.rank()
            values = {d: [rank_values(r, (2 * n, 3), d, seed=ps.process_set_id) for r in ps.ranks] for d in MOVABLE}
            for dtype in MOVABLE:
                with self.subTest(set=ps.ranks, dtype=dtype.name):
                    out = sd.alltoall(tf.constant(values[dtype][me], dtype), process_set=ps)
                    self.assertAllEqual(out.numpy(), np.concatenate([v[2 * me:2 * me + 2] for v in values[dtype]]))
            graph = tf.function(lambda xs, ps=ps: [sd.alltoall(x, process_set=ps) for x in xs])
            outs = graph([tf.constant(values[d][me], d) for d in (tf.float32, tf.bool)])
            for out, d in zip(outs, (tf.float32, tf.bool)):
                self.assertAllEqual(out.numpy(), np.concatenate([v[2 * me:2 * me + 2] for v in values[d]]))

    def test_explicit_uneven_splits_return_received_splits(self):
        for ps in my_sets():
            n, me = ps.size(), ps.rank()

            def splits_of(i):  # member i sends (its rank + j) % 3 rows to member j: some none
                return [(ps.ranks[i] + j) % 3 for j in range(n)]

            values = [rank_values(r, (sum(splits_of(i)), 2), tf.float32, seed=ps.process_set_id) for i, r in enumerate(ps.ranks)]
            expected = np.concatenate([values[i][sum(splits_of(i)[:me]):sum(splits_of(i)[:me + 1])] for i in range(n)])
            runs = [sd.alltoall, tf.function(lambda x, s, ps=ps: sd.alltoall(x, splits=s, process_set=ps))]
            for run in runs:
                if run is sd.alltoall:
                    out, received = sd.alltoall(tf.constant(values[me]), splits=splits_of(me), process_set=ps)
                else:
                    out, received = run(tf.constant(values[me]), tf.constant(splits_of(me)))
                self.assertAllEqual(received, [splits_of(i)[me] for i in range(n)])
                self.assertAllEqual(out.numpy(), expected)


class ReducescatterTest(tf.test.TestCase):
    def test_every_dtype_sum_and_average_with_uneven_rows(self):
        for ps in my_sets():
            n, me = ps.size(), ps.rank()
            rows = 2 * n + 1
            for dtype in REDUCIBLE:
                for op in (sd.Sum, sd.Average):
                    with self.subTest(set=ps.ranks, dtype=dtype.name, op=op):
                        values = set_values(ps, (rows, 2), dtype, op, seed=4)
                        out = sd.reducescatter(tf.constant(values[me], dtype), op=op, process_set=ps)
                        self.assertEqual(out.dtype, dtype)
                        expected = expected_reduction(values, op, dtype)[block_of(rows, n, me)]
                        self.assertAllClose(as_f64(out), expected, **tolerance(dtype))

    def test_in_tf_function_every_op_and_grouped(self):
        for ps in my_sets():
            n, me = ps.size(), ps.rank()
            rows = 3 * n
            values = {op: set_values(ps, (rows, 3), tf.float32, op, seed=5) for op in REDUCE_OPS}
            graph = tf.function(lambda xs, ps=ps: [sd.reducescatter(x, op=op, process_set=ps) for x, op in zip(xs, REDUCE_OPS)])
            outs = graph([tf.constant(values[op][me]) for op in REDUCE_OPS])
            for out, op in zip(outs, REDUCE_OPS):
                with self.subTest(set=ps.ranks, op=op):
                    self.assertAllClose(out, expected_reduction(values[op], op, tf.float32)[block_of(rows, n, me)], rtol=1e-5)
            ints = set_values(ps, (rows, 2), tf.int32, seed=6)
            outs = sd.grouped_reducescatter([tf.constant(values[sd.Sum][me]), tf.constant(ints[me])], op=sd.Sum, process_set=ps)
            self.assertAllClose(outs[0], expected_reduction(values[sd.Sum], sd.Sum, tf.float32)[block_of(rows, n, me)], rtol=1e-5)
            self.assertAllEqual(outs[1], expected_reduction(ints, sd.Sum, tf.int32)[block_of(rows, n, me)])


class BarrierTest(tf.test.TestCase):
    def test_barrier_waits_for_every_member(self):
        for ps in ALL_SETS:
            sd.barrier()  # every rank starts each set's round together
            entered = returned = 0.0
            if ps.included():
                if RANK == ps.ranks[-1]:
                    time.sleep(DELAY_S)
                entered = time.time()
                sd.barrier(process_set=ps)
                returned = time.time()
            times = sd.allgather(tf.constant([[entered, returned]], tf.float64)).numpy()
            last_arrived = times[ps.ranks[-1], 0]
            for r in ps.ranks:
                self.assertGreaterEqual(times[r, 1], last_arrived, f"rank {r} left the barrier on {ps.ranks} "
                                                                    f"before rank {ps.ranks[-1]} came")

    def test_barrier_in_tf_function(self):
        for ps in my_sets():
            graph = tf.function(lambda ps=ps: sd.barrier(process_set=ps))
            graph()
            graph()


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


class OverlappingSetsTest(tf.test.TestCase):
    def test_every_set_and_the_global_set_in_one_tf_function(self):
        mine = my_sets()

        # Named: each rank traces a graph of its own sets, and an unnamed op in a graph goes by its node
        # name ("SmdistAllreduce_2"), which differs between graphs of different sizes.
        @tf.function
        def step(x):
            per_set = [sd.allreduce(x * float(ps.process_set_id), op=sd.Sum, name=f"ps.step.{ps.process_set_id}",
                                    process_set=ps) for ps in mine]
            gathered = [sd.allgather(tf.reshape(x[:1], [1]), name=f"ps.step.gather.{ps.process_set_id}", process_set=ps)
                        for ps in mine]
            return per_set, gathered, sd.allreduce(x, op=sd.Sum, name="ps.step.global")

        for _ in range(2):
            per_set, gathered, everyone = step(tf.fill([3], float(RANK + 1)))
            for ps, out, got in zip(mine, per_set, gathered):
                self.assertAllClose(out, [ps.process_set_id * sum(r + 1 for r in ps.ranks)] * 3)
                self.assertAllClose(got, [r + 1 for r in ps.ranks])
            self.assertAllClose(everyone, [SIZE * (SIZE + 1) / 2] * 3)

    def test_every_set_from_its_own_thread_while_the_main_thread_runs_global_collectives(self):
        # At 4 ranks rank 1 runs odd, low and high at the same time, rank 3 odd, high, top and solo.
        rounds = 5
        results, errors = {}, []

        def work(ps):
            try:
                for k in range(rounds):
                    x = tf.fill([1000], float(RANK + k))
                    results[(ps.process_set_id, k)] = (
                        sd.allreduce(x, op=sd.Sum, name=f"ps.thread.{k}", process_set=ps).numpy(),
                        sd.allgather(tf.constant([RANK]), name=f"ps.thread.gather.{k}", process_set=ps).numpy(),
                    )
            except Exception as e:  # reported below, on the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(ps,)) for ps in my_sets()]
        for t in threads:
            t.start()
        for k in range(rounds):
            self.assertAllClose(sd.allreduce(tf.constant([float(k)]), op=sd.Sum, name=f"ps.main.{k}"), [SIZE * k])
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(errors, [])
        for ps in my_sets():
            for k in range(rounds):
                summed, gathered = results[(ps.process_set_id, k)]
                self.assertAllClose(summed, np.full([1000], sum(r + k for r in ps.ranks)))
                self.assertAllEqual(gathered, ps.ranks)


class ConcurrentSetsTest(tf.test.TestCase):
    def test_disjoint_sets_run_large_allreduces_at_the_same_time(self):
        n = 1 << 20  # 4 MiB
        sd.barrier()
        ps = DISJOINT[0] if DISJOINT[0].included() else DISJOINT[1]
        loop = tf.function(lambda x, ps=ps: sd.allreduce(sd.allreduce(x, op=sd.Sum, process_set=ps), op=sd.Average,
                                                         process_set=ps))
        for it in range(4):
            x = tf.fill([n], float(RANK + it))
            total = sum(r + it for r in ps.ranks)
            self.assertAllEqual(sd.allreduce(x, op=sd.Sum, process_set=ps), np.full([n], total, np.float32))
            self.assertAllEqual(loop(x), np.full([n], total, np.float32))
            gathered = sd.allgather(tf.fill([n // 4], float(RANK + it)), process_set=ps).numpy()
            self.assertAllEqual(gathered, np.repeat(np.array([r + it for r in ps.ranks], np.float32), n // 4))
        sd.barrier()

    def test_a_set_does_not_wait_for_another_sets_members(self):
        # The slow set's members come SLOW_S late (at 4 ranks its first member waits inside a
        # collective on it meanwhile): the fast set must be done before any of them comes.
        fast, slow = DISJOINT
        sd.barrier()
        fast_done = slow_came = 0.0
        if fast.included():
            for _ in range(3):
                self.assertAllClose(sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum, process_set=fast), [sum(fast.ranks)])
                self.assertAllEqual(sd.allgather(tf.constant([RANK]), process_set=fast), fast.ranks)
                self.assertAllEqual(sd.broadcast(tf.constant([RANK]), fast.ranks[-1], process_set=fast), [fast.ranks[-1]])
                sd.barrier(process_set=fast)
            fast_done = time.time()
        else:
            start = time.monotonic()
            late = slow.size() == 1 or RANK != slow.ranks[0]
            if late:
                time.sleep(SLOW_S)
                slow_came = time.time()
            self.assertAllEqual(sd.allgather(tf.constant([RANK]), process_set=slow), slow.ranks)
            self.assertGreater(time.monotonic() - start, SLOW_S * 0.9)
        times = sd.allgather(tf.constant([[fast_done, slow_came]], tf.float64)).numpy()
        last_fast = max(times[r, 0] for r in fast.ranks)
        first_slow = min(times[r, 1] for r in slow.ranks if times[r, 1] > 0)
        self.assertLess(last_fast, first_slow, f"set {fast.ranks} waited for set {slow.ranks}")


class TimelineTest(tf.test.TestCase):
    def test_set_events_name_their_process_set(self):
        template = os.path.join(tempfile.mkdtemp(), "timeline.{rank}.json")
        sd.start_timeline(template)
        for ps in my_sets():
            sd.allgather(tf.ones([2]), name=f"ps.timeline.gather.{ps.process_set_id}", process_set=ps)
            if ps.size() > 1:  # a one-rank allreduce never reaches the engine
                sd.allreduce(tf.ones([3]), op=sd.Sum, name=f"ps.timeline.reduce.{ps.process_set_id}", process_set=ps)
        sd.allreduce(tf.ones([3]), op=sd.Sum, name="ps.timeline.global")
        sd.stop_timeline()
        with open(template.format(rank=RANK)) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        spans = [e for e in events if e["ph"] == "X"]
        for ps in my_sets():
            pid = ps.process_set_id
            names = [f"ps.timeline.gather.{pid}"] + ([f"ps.timeline.reduce.{pid}"] if ps.size() > 1 else [])
            for name in names:
                label = f"{name} [process set {pid}]"
                mine = [e for e in spans if rows[e["tid"]] == label]
                self.assertTrue(mine, f"no events in row {label!r}; rows: {sorted(rows.values())}")
                self.assertTrue(all(e["args"].get("process_set") == pid for e in mine), mine)
        global_spans = [e for e in spans if rows[e["tid"]] == "ps.timeline.global"]
        self.assertTrue(global_spans)
        self.assertTrue(all("process_set" not in e["args"] for e in global_spans), global_spans)


class NotAMemberTest(tf.test.TestCase):
    def test_every_collective_on_a_set_this_rank_is_not_in(self):
        for i, ps in enumerate(other_sets()):
            for kind, run in {**COLLECTIVES, **EAGER_ONLY}.items():
                with self.subTest(set=ps.ranks, kind=kind):
                    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, f"rank {RANK} is not a member of process set"):
                        run(ps, ps.size())
                    if kind in COLLECTIVES and i == 0:  # traced on one set: tracing is what takes time
                        with self.assertRaises(tf.errors.InvalidArgumentError):
                            tf.function(lambda ps=ps, run=run: run(ps, ps.size()))()
        # Meanwhile the members ran the same collectives, undisturbed.
        for ps in my_sets():
            for kind, run in {**COLLECTIVES, **EAGER_ONLY}.items():
                run(ps, ps.size())
            self.assertAllClose(sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum, process_set=ps), [sum(ps.ranks)])
        self.assertAllClose(sd.allreduce(tf.constant([1.0]), op=sd.Sum), [SIZE])

    def test_strategy_and_tape_on_a_set_this_rank_is_not_in(self):
        for ps in other_sets():
            with self.subTest(set=ps.ranks):
                with self.assertRaisesRegex(ValueError, f"rank {RANK} is not a member"):
                    sd.DataParallelStrategy(process_set=ps)
                # As Horovod: the tape leaves an outsider's gradients as they are.
                x = tf.Variable([float(RANK + 1)])
                with tf.GradientTape() as tape:
                    loss = 3.0 * tf.reduce_sum(x)
                grads = sd.DistributedGradientTape(tape, process_set=ps).gradient(loss, [x])
                self.assertAllClose(grads[0], [3.0])

    def test_unregistered_or_foreign_sets_raise_value_error(self):
        never = sd.ProcessSet([0])
        forged = sd.ProcessSet([0])
        forged.process_set_id = max(_rt.process_set_ids()) + 10  # what Horovod's test does
        for bad in (never, forged, "even", 1):
            for kind, run in {**COLLECTIVES, **EAGER_ONLY}.items():
                with self.subTest(bad=repr(bad), kind=kind):
                    with self.assertRaises(ValueError):
                        run(bad, 1)
        self.assertAllClose(sd.allreduce(tf.constant([1.0]), op=sd.Sum), [SIZE])

    def test_broadcast_root_outside_the_set_fails_on_every_member(self):
        for ps in my_sets():
            outsider = next(r for r in range(SIZE) if r not in ps.ranks)
            for root in (outsider, SIZE, -1):
                with self.subTest(set=ps.ranks, root=root):
                    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, f"root_rank {root} is not a member"):
                        sd.broadcast(tf.ones([3]), root, process_set=ps)
                    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, f"root_rank {root} is not a member"):
                        sd.grouped_broadcast([tf.ones([3]), tf.ones([2])], root, process_set=ps)
                    with self.assertRaises(tf.errors.InvalidArgumentError):
                        tf.function(lambda ps=ps, root=root: sd.broadcast(tf.ones([3]), root, process_set=ps))()
            # The set still works.
            self.assertAllEqual(sd.broadcast(tf.constant([RANK]), ps.ranks[0], process_set=ps), [ps.ranks[0]])


class StaticSetsTest(tf.test.TestCase):
    def test_add_and_remove_need_dynamic_sets(self):
        for call in (lambda: sd.add_process_set([0]), lambda: sd.add_process_set(sd.ProcessSet([0])),
                     lambda: sd.remove_process_set(ALL_SETS[0])):
            with self.assertRaisesRegex(ValueError, "dynamic process sets"):
                call()
        self.assertEqual(sorted(_rt.process_set_ids()), sorted([0] + [ps.process_set_id for ps in ALL_SETS]))
        for ps in my_sets():
            self.assertAllEqual(sd.allgather(tf.constant([RANK]), process_set=ps), ps.ranks)

    def test_init_again_keeps_the_sets_and_refuses_new_ones(self):
        ids = [ps.process_set_id for ps in ALL_SETS]
        sd.init()
        self.assertEqual([ps.process_set_id for ps in ALL_SETS], ids)
        with self.assertRaisesRegex(ValueError, "already initialized with process sets"):
            sd.init(process_sets=[sd.ProcessSet([0])])
        self.assertEqual([ps.process_set_id for ps in ALL_SETS], ids)
        for ps in my_sets():
            self.assertAllEqual(sd.allgather(tf.constant([RANK]), process_set=ps), ps.ranks)


class RegistrationTest(tf.test.TestCase):
    """add_process_set / remove_process_set, and init's static sets; every error on every rank."""

    def setUp(self):
        super().setUp()
        restart(process_sets="dynamic")

    @classmethod
    def tearDownClass(cls):
        restart(process_sets=ALL_SETS)
        super().tearDownClass()

    def assert_only_sets(self, *sets):
        self.assertEqual(sorted(_rt.process_set_ids()), sorted([0] + [ps.process_set_id for ps in sets]))

    def assert_set_works(self, ps):
        # Named: after a restart set ids start again at 1 and unnamed calls on a set may not match
        # (see test_unnamed_calls_on_a_set_whose_id_an_earlier_engine_used).
        if ps.included():
            self.assertAllClose(sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum, name="ps.works", process_set=ps),
                                [sum(ps.ranks)])
            self.assertAllEqual(sd.allgather(tf.constant([RANK]), name="ps.works", process_set=ps), ps.ranks)
            self.assertAllEqual(sd.broadcast(tf.constant([RANK]), ps.ranks[-1], name="ps.works", process_set=ps),
                                [ps.ranks[-1]])
        self.assertAllClose(sd.allreduce(tf.constant([1.0]), op=sd.Sum), [SIZE])  # and the global set

    # Unnamed calls are numbered per process set id; a set that takes an id an earlier set (here of an
    # earlier engine) had must start its count afresh on every member, or its unnamed calls never match.
    def test_unnamed_calls_on_a_set_whose_id_an_earlier_engine_used(self):
        if SIZE < 4:
            self.skipTest("needs a set of two ranks that is not the global set")
        ps = sd.add_process_set([0, 1])
        # Before the restart set id 1 was "even" ([0, 2]): rank 0 has made unnamed calls on it, rank 1 none.
        self.assertEqual((ps.process_set_id, STATIC_IDS["even"]), (1, 1))
        done = []

        def unnamed_allreduce():
            try:
                done.append(sd.allreduce(tf.constant([1.0]), op=sd.Sum, process_set=ps).numpy())
            except tf.errors.AbortedError:
                pass  # the hung call, failed by the next restart

        if ps.included():
            thread = threading.Thread(target=unnamed_allreduce, daemon=True)
            thread.start()
            thread.join(timeout=3.0)  # a hung call is ended by the next restart (shutdown fails it)
        finished = sd.allgather(tf.constant([int(bool(done) or not ps.included())]), name="ps.recycled.finished")
        self.assertAllEqual(finished, [1] * SIZE)

    def test_add_use_remove_and_add_again(self):
        sets = [sd.add_process_set(ranks) for ranks in DYNAMIC_RANKS]
        ids = [ps.process_set_id for ps in sets]
        self.assertTrue(all(isinstance(ps, sd.ProcessSet) for ps in sets))
        self.assertEqual([ps.ranks for ps in sets], DYNAMIC_RANKS)
        self.assertTrue(all(i > 0 for i in ids) and len(set(ids)) == len(ids), ids)
        everyone = sd.allgather(tf.constant([ids])).numpy()
        self.assertTrue(all((row == ids).all() for row in everyone), everyone)
        self.assert_only_sets(*sets)
        for ps in sets:
            self.assertEqual((ps.size(), ps.included()), (len(ps.ranks), RANK in ps.ranks))
            self.assert_set_works(ps)

        first = sets[0]
        self.assertTrue(sd.remove_process_set(first))
        self.assertIsNone(first.process_set_id)
        self.assertEqual((first.size(), first.rank(), first.included()), (None, None, None))
        for kind, run in {**COLLECTIVES, **EAGER_ONLY}.items():
            with self.subTest(kind=kind):
                with self.assertRaisesRegex(ValueError, "not registered"):
                    run(first, len(first.ranks))
        with self.assertRaises(tf.errors.InvalidArgumentError):
            sd.size_op(process_set_id=ids[0])
        self.assert_only_sets(sets[1])
        self.assert_set_works(sets[1])  # the other set is untouched

        again = sd.add_process_set(first)  # the same object, registered again
        self.assertIs(again, first)
        self.assertIsNotNone(first.process_set_id)
        self.assertNotEqual(first.process_set_id, sets[1].process_set_id)
        self.assert_only_sets(*sets)
        self.assert_set_works(first)
        self.assertEqual(int(sd.size_op(process_set_id=first.process_set_id)), len(first.ranks))
        for ps in sets:
            self.assertTrue(sd.remove_process_set(ps))
        self.assert_only_sets()
        self.assert_set_works(sd.add_process_set(list(reversed(DYNAMIC_RANKS[1]))))

    def test_misuse_on_one_rank_is_refused_there(self):
        ps = sd.add_process_set(DYNAMIC_RANKS[0])
        with self.assertRaisesRegex(ValueError, "already registered"):
            sd.add_process_set(ps)
        self.assertFalse(sd.remove_process_set(sd.global_process_set))
        self.assert_set_works(sd.global_process_set)
        with self.assertRaisesRegex(ValueError, "not registered"):
            sd.remove_process_set(sd.ProcessSet([0]))
        self.assertTrue(sd.remove_process_set(ps))
        with self.assertRaisesRegex(ValueError, "not registered"):
            sd.remove_process_set(ps)
        self.assert_only_sets()

    def test_ranks_that_disagree_fail_on_every_rank(self):
        a, b = DYNAMIC_RANKS
        with self.assertRaisesRegex(ValueError, "same arguments"):
            sd.add_process_set([RANK])  # a different set on every rank
        self.assert_only_sets()
        # The same two sets, registered in different orders.
        order = [a, b] if RANK % 2 == 0 else [b, a]
        for ranks in order:
            with self.assertRaisesRegex(ValueError, "same arguments"):
                sd.add_process_set(ranks)
        self.assert_only_sets()
        sets = [sd.add_process_set(a), sd.add_process_set(b)]
        # Removed in different orders.
        with self.assertRaisesRegex(ValueError, "same arguments"):
            sd.remove_process_set(sets[RANK % 2])
        self.assert_only_sets(*sets)
        for ps in sets:
            self.assert_set_works(ps)
            self.assertTrue(sd.remove_process_set(ps))
        self.assert_only_sets()
        self.assert_set_works(sd.add_process_set(a))

    def test_invalid_ranks_fail_on_every_rank(self):
        existing = sd.add_process_set(DYNAMIC_RANKS[0])
        cases = [
            ("out of range", [0, SIZE]),
            ("out of range", [-1]),
            ("listed twice", [0, 0]),
            ("at least one rank", []),
            ("already registered \\(id 0\\)", list(range(SIZE))),  # the global set's ranks
            (f"already registered \\(id {existing.process_set_id}\\)", list(reversed(DYNAMIC_RANKS[0]))),
        ]
        for pattern, ranks in cases:
            with self.subTest(ranks=ranks):
                with self.assertRaisesRegex(ValueError, pattern):
                    sd.add_process_set(ranks)
        self.assert_only_sets(existing)
        self.assert_set_works(existing)

    def test_remove_with_a_collective_in_flight_fails_on_every_rank(self):
        if SIZE < 4:
            self.skipTest("needs a set of two ranks that is not the global set")
        ps = sd.add_process_set([0, 1])
        for submitter in ps.ranks:  # the set's first member, then another
            late = next(r for r in ps.ranks if r != submitter)
            name = f"ps.in_flight.{submitter}"
            result, errors = [], []
            thread = None
            if RANK == submitter:
                def submit():
                    try:
                        result.append(sd.allreduce(tf.ones([3]), op=sd.Sum, name=name, process_set=ps).numpy())
                    except Exception as e:
                        errors.append(e)

                thread = threading.Thread(target=submit)
                thread.start()
                time.sleep(1.0)  # the allreduce waits for `late`, which submits only after the removal failed
            with self.assertRaisesRegex(ValueError, f"in flight on rank\\(s\\) {submitter}"):
                sd.remove_process_set(ps)
            self.assertIsNotNone(ps.process_set_id)
            if RANK == late:
                self.assertAllEqual(sd.allreduce(tf.ones([3]), op=sd.Sum, name=name, process_set=ps), [2.0] * 3)
            if thread is not None:
                thread.join(timeout=60)
                self.assertEqual(errors, [])
                self.assertAllEqual(result[0], [2.0] * 3)
            sd.barrier()
        self.assertTrue(sd.remove_process_set(ps))
        self.assert_only_sets()

    def test_environment_turns_on_dynamic_sets(self):
        for variable in ("SMDIST_DYNAMIC_PROCESS_SETS", "HOROVOD_DYNAMIC_PROCESS_SETS"):
            with self.subTest(variable=variable):
                try:
                    restart(**{variable: "0"})
                    with self.assertRaisesRegex(ValueError, "dynamic process sets"):
                        sd.add_process_set(DYNAMIC_RANKS[0])
                    static = sd.ProcessSet(DYNAMIC_RANKS[1])
                    restart([static], **{variable: "1"})  # static sets, and more may be added
                    self.assert_set_works(static)
                    added = sd.add_process_set(DYNAMIC_RANKS[0])
                    self.assert_set_works(added)
                    self.assertTrue(sd.remove_process_set(added))
                    self.assertTrue(sd.remove_process_set(static))
                    self.assert_only_sets()
                finally:
                    os.environ.pop(variable, None)

    def test_init_registers_static_sets_in_order_or_fails_on_every_rank(self):
        static = [sd.ProcessSet(ranks) for ranks in DYNAMIC_RANKS]
        restart(static)
        self.assertEqual(sorted(ps.process_set_id for ps in static), [ps.process_set_id for ps in static])
        self.assert_only_sets(*static)
        for ps in static:
            self.assert_set_works(ps)
        with self.assertRaisesRegex(ValueError, "dynamic process sets"):
            sd.add_process_set([0])  # static only
        bad = {
            "out of range": [sd.ProcessSet([0, SIZE])],
            "already registered": [sd.ProcessSet([0]), sd.ProcessSet([0])],
            "same arguments": [sd.ProcessSet([RANK])],
            "ProcessSet objects": [[0]],
            "'dynamic'": "everything",
        }
        for pattern, sets in bad.items():
            with self.subTest(pattern=pattern):
                sd.shutdown()
                with self.assertRaisesRegex(ValueError, pattern):
                    sd.init(process_sets=sets)
                self.assertAllClose(sd.allreduce(tf.constant([1.0]), op=sd.Sum), [SIZE])

    def test_sets_from_mpi4py_communicators(self):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD.Split(color=RANK % 2, key=RANK)
        try:
            ps = sd.ProcessSet(comm)
            self.assertEqual(ps.ranks, list(range(RANK % 2, SIZE, 2)))
            restart([ps])  # each rank passes its own group's communicator
            self.assertTrue(ps.included())
            self.assertEqual(ps.rank(), RANK // 2)
            self.assertEqual(len(_rt.process_set_ids()), 3)  # both groups, on every rank
            self.assert_set_works(ps)
        finally:
            comm.Free()


if __name__ == "__main__":
    tf.test.main()
