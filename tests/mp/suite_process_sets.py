"""Process sets: membership and every collective among a subset of the ranks, against local expectations.

Run on every rank by tests/test_process_sets_multiprocess.py, in one job with the other suite_process_sets*.py;
tests/mp/process_set_setup.py registers the sets they share (even, odd, low, high, top, solo at 4 ranks).
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf import process_sets as _process_sets
from smdist_tf._native import runtime as _rt
from tests.mp.collective_expectations import MOVABLE, REDUCE_OPS, REDUCIBLE, expected_reduction, rank_values, tolerance
from tests.mp.process_set_setup import ALL_SETS, SETS, as_f64, block_of, my_sets, set_values, static_set_ranks

RANK, SIZE = sd.rank(), sd.size()
HANG_S = 90  # a test still running after this is hung (each takes seconds): end the job with the stack instead
DELAY_S = 0.25  # long enough for the other members to be waiting


class MembershipTest(tf.test.TestCase):
    def test_ids_ranks_size_rank_and_included(self):
        ids = [ps.process_set_id for ps in ALL_SETS]
        self.assertTrue(all(isinstance(i, int) and i > 0 for i in ids), ids)
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(sorted(_rt.process_set_ids()), sorted([0] + ids))
        for name, ranks in static_set_ranks().items():
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


if __name__ == "__main__":
    tf.test.main()
