"""Every collective x dtype x op against a locally computed expectation, eager and in tf.function.

Run on every rank by tests/test_collectives_multiprocess.py.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.collective_expectations import (
    MOVABLE,
    REDUCE_OPS,
    REDUCIBLE,
    all_rank_values,
    expected_reduction,
    rank_values,
    tolerance,
)
from tests.mp.rank_counts import at_two_ranks_only

RANK, SIZE = sd.rank(), sd.size()
SHAPES = [(), (5,), (2, 3, 4)]


def as_f64(t) -> np.ndarray:
    return tf.cast(t, tf.float64).numpy() if t.dtype != tf.bool else t.numpy()


class AllreduceTest(tf.test.TestCase):
    def _check(self, run, dtype, op, shape, **scale):
        values = all_rank_values(shape, dtype, op, seed=len(shape))
        out = run(tf.constant(values[RANK], dtype))
        self.assertEqual(out.dtype, dtype)
        self.assertEqual(tuple(out.shape), shape)
        self.assertAllClose(as_f64(out), expected_reduction(values, op, dtype, **scale), **tolerance(dtype))

    def test_every_dtype_and_op_eager(self):
        for dtype in REDUCIBLE:
            for op in REDUCE_OPS:
                for shape in SHAPES:
                    with self.subTest(dtype=dtype.name, op=op, shape=shape):
                        self._check(lambda x: sd.allreduce(x, op=op), dtype, op, shape)

    @at_two_ranks_only("a tf.function runs the eager path's kernel; the eager matrix above runs at 4 ranks")
    def test_every_dtype_and_op_in_tf_function(self):
        for dtype in REDUCIBLE:
            for op in REDUCE_OPS:
                fn = tf.function(lambda x, op=op: sd.allreduce(x, op=op))
                with self.subTest(dtype=dtype.name, op=op):
                    self._check(fn, dtype, op, (3, 4))

    def test_default_op_is_average_and_legacy_average_flag(self):
        values = all_rank_values((4,), tf.float32)
        expected = expected_reduction(values, sd.Average, tf.float32)
        self.assertAllClose(sd.allreduce(tf.constant(values[RANK])), expected)
        summed = expected_reduction(values, sd.Sum, tf.float32)
        self.assertAllClose(sd.allreduce(tf.constant(values[RANK]), average=False), summed, rtol=1e-5)
        with self.assertRaisesRegex(ValueError, "either op= or"):
            sd.allreduce(tf.constant(values[RANK]), average=True, op=sd.Sum)

    def test_prescale_and_postscale(self):
        for dtype in [tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int32]:
            for op in [sd.Sum, sd.Average]:
                with self.subTest(dtype=dtype.name, op=op):
                    self._check(
                        lambda x: sd.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=3.0),
                        dtype, op, (6,), prescale=0.5, postscale=3.0,
                    )

    def test_compression_moves_16_bits_and_restores_dtype(self):
        values = all_rank_values((64,), tf.float32)
        expected = expected_reduction(values, sd.Average, tf.float32)
        for compression in [sd.Compression.fp16, sd.Compression.bf16]:
            out = sd.allreduce(tf.constant(values[RANK]), compression=compression)
            self.assertEqual(out.dtype, tf.float32)
            self.assertAllClose(out, expected, rtol=3e-2, atol=3e-2)

    def test_inf_and_nan_propagate(self):
        x = np.array([1.0, 2.0, 3.0], np.float32)
        if RANK == 0:
            x = np.array([np.inf, np.nan, 3.0], np.float32)
        for op in [sd.Sum, sd.Max, sd.Min]:
            out = sd.allreduce(tf.constant(x), op=op).numpy()
            self.assertTrue(np.isnan(out[1]), f"op {op}")
            if op != sd.Min:
                self.assertEqual(out[0], np.inf)

    def test_narrow_integer_sums_wrap_around_as_tensorflow_does(self):
        # Open MPI's AVX reduction saturates 8/16-bit sums (int8 100 + 100 -> 127); TF wraps.
        for dtype in (np.int8, np.uint8, np.int16, np.uint16):
            big = np.iinfo(dtype).max - 3
            for count in (17, 300_000):  # small ones travel through MPI, large ones through shared memory
                x = np.full([count], big, dtype)
                want = tf.add_n([tf.constant(x)] * SIZE).numpy()
                for op, expected in ((sd.Sum, want), (sd.Product, None)):
                    got = sd.allreduce(tf.constant(x), op=op, name=f"wrap.{op}.{np.dtype(dtype).name}.{count}").numpy()
                    if expected is None:
                        expected = np.full([count], np.prod(np.full([SIZE], big, dtype), dtype=dtype), dtype)
                    self.assertAllEqual(got, expected, msg=f"{np.dtype(dtype).name} x{count} op {op}")

    def test_zero_size_tensor(self):
        out = sd.allreduce(tf.zeros([0, 3]), op=sd.Sum)
        self.assertEqual(out.shape, (0, 3))

    def test_grouped_allreduce_mixed_dtypes(self):
        dtypes = [tf.float32, tf.int32, tf.float16, tf.float32, tf.bfloat16, tf.int64, tf.float64]
        values = [all_rank_values((i + 1, 3), dt, seed=i) for i, dt in enumerate(dtypes)]
        for fn in [sd.grouped_allreduce, tf.function(lambda ts: sd.grouped_allreduce(ts, op=sd.Sum))]:
            op = sd.Average if fn is sd.grouped_allreduce else sd.Sum
            outs = fn([tf.constant(v[RANK], dt) for v, dt in zip(values, dtypes)])
            for out, v, dt in zip(outs, values, dtypes):
                self.assertAllClose(as_f64(out), expected_reduction(v, op, dt), **tolerance(dt))

    def test_fusion_of_many_tensors_in_one_step(self):
        n = 200
        values = [all_rank_values((i % 17 + 1,), tf.float32, seed=i) for i in range(n)]

        @tf.function
        def step(tensors):
            return sd.grouped_allreduce(tensors, op=sd.Sum)

        outs = step([tf.constant(v[RANK]) for v in values])
        for out, v in zip(outs, values):
            self.assertAllClose(out, expected_reduction(v, sd.Sum, tf.float32), rtol=1e-5, atol=1e-5)

    def test_group_larger_than_the_response_cache(self):
        # More tensors than the response cache holds (1024 by default): repeats are agreed on partly
        # through the cache and partly in full, in one cycle, and every result must still be right.
        n = 1500
        values = [all_rank_values((i % 7 + 1,), tf.float32, seed=i) for i in range(n)]
        inputs = [tf.constant(v[RANK]) for v in values]
        expected = np.concatenate([expected_reduction(v, sd.Sum, tf.float32) for v in values])
        for _ in range(3):
            outs = sd.grouped_allreduce(inputs, op=sd.Sum, name="big.group")
            self.assertEqual(len(outs), n)
            self.assertAllClose(np.concatenate([o.numpy() for o in outs]), expected, rtol=1e-5, atol=1e-5)

    def test_indexed_slices_are_gathered(self):
        slices = tf.IndexedSlices(tf.fill([2, 3], float(RANK + 1)), tf.constant([RANK, RANK + 1]), tf.constant([SIZE + 1, 3]))
        out = sd.allreduce(slices, op=sd.Sum)
        self.assertIsInstance(out, tf.IndexedSlices)
        dense = tf.convert_to_tensor(out).numpy()
        expected = np.zeros([SIZE + 1, 3], np.float32)
        for r in range(SIZE):
            expected[r] += r + 1
            expected[r + 1] += r + 1
        self.assertAllClose(dense, expected)

    def test_indexed_slices_average_every_dtype(self):
        # Each rank's values are 10 * (rank + 1) + 1; Average scales the gathered rows by 1/size().
        # Integer rows are divided exactly into floats, as Horovod does (they used to become zeros).
        for dtype in REDUCIBLE:
            with self.subTest(dtype=dtype.name):
                values = tf.cast(tf.fill([1, 2], 10 * (RANK + 1) + 1), dtype)
                out = sd.allreduce(tf.IndexedSlices(values, tf.constant([RANK]), tf.constant([SIZE, 2])), op=sd.Average)
                want_dtype = dtype if dtype.is_floating else tf.float32 if dtype.size <= 2 else tf.float64
                self.assertEqual(out.values.dtype, want_dtype)
                expected = np.array([[(10 * (r + 1) + 1) / SIZE] * 2 for r in range(SIZE)])
                self.assertAllClose(as_f64(out.values), expected, **tolerance(want_dtype))
                self.assertAllEqual(out.indices, np.arange(SIZE))

    def test_oob_allreduce_averages(self):
        self.assertAllClose(sd.oob_allreduce(tf.constant(float(RANK))), (SIZE - 1) / 2.0)

    def test_invalid_arguments(self):
        with self.assertRaisesRegex(ValueError, "unknown reduction op"):
            sd.allreduce(tf.ones([2]), op=42)
        with self.assertRaisesRegex(TypeError, "does not support dtype bool"):
            sd.allreduce(tf.constant([True]))
        with self.assertRaisesRegex(TypeError, "does not support dtype string"):
            sd.broadcast(tf.constant(["a"]), 0)
        # TensorFlow rejects the dtype before anything is submitted; the message is ours, eager and traced.
        with self.assertRaisesRegex(TypeError, "allreduce does not support dtype bool"):
            sd.grouped_allreduce([tf.ones([2]), tf.constant([True])], name="bad.dtype")
        with self.assertRaisesRegex(TypeError, "allreduce does not support dtype complex64"):
            tf.function(lambda x: sd.grouped_allreduce([x], name="bad.traced"))(tf.constant([1j], tf.complex64))
        # Nothing of the refused call is left in flight: the same names go through afterwards.
        outs = sd.grouped_allreduce([tf.ones([2]), tf.ones([1])], op=sd.Sum, name="bad.dtype")
        self.assertAllClose(outs[0], [SIZE] * 2)
        self.assertAllClose(outs[1], [SIZE])


class AllgatherTest(tf.test.TestCase):
    def test_every_dtype_with_ragged_first_dimension(self):
        # Rank r contributes r rows: rank 0 sends none.
        for dtype in MOVABLE:
            values = [rank_values(r, (r, 2, 3), dtype) for r in range(SIZE)]
            for fn in [sd.allgather, tf.function(sd.allgather)]:
                with self.subTest(dtype=dtype.name, graph=fn is not sd.allgather):
                    out = fn(tf.constant(values[RANK], dtype))
                    self.assertEqual(out.dtype, dtype)
                    self.assertAllEqual(out.numpy(), np.concatenate(values))

    def test_scalar_becomes_vector(self):
        self.assertAllEqual(sd.allgather(tf.constant(RANK)), list(range(SIZE)))


class BroadcastTest(tf.test.TestCase):
    def test_every_dtype_from_every_root(self):
        for dtype in MOVABLE:
            for root in range(SIZE):
                values = [rank_values(r, (3, 2), dtype) for r in range(SIZE)]
                for fn in [sd.broadcast, tf.function(sd.broadcast)]:
                    with self.subTest(dtype=dtype.name, root=root):
                        out = fn(tf.constant(values[RANK], dtype), root)
                        self.assertAllEqual(out.numpy(), values[root])

    def test_broadcast_variables_tf_and_keras(self):
        import keras

        tf_var = tf.Variable(tf.fill([3], float(RANK)))
        keras_var = keras.Variable(np.full([2, 2], RANK, np.float32))
        int_var = tf.Variable(RANK + 10)
        sd.broadcast_variables([tf_var, keras_var, int_var], root_rank=SIZE - 1)
        self.assertAllEqual(tf_var.numpy(), [SIZE - 1.0] * 3)
        self.assertAllEqual(keras_var.numpy(), np.full([2, 2], SIZE - 1))
        self.assertEqual(int_var.numpy(), SIZE - 1 + 10)

    def test_broadcast_variables_in_tf_function(self):
        var = tf.Variable(tf.fill([4], float(RANK)))

        @tf.function
        def sync():
            sd.broadcast_variables([var], root_rank=0)

        sync()
        self.assertAllEqual(var.numpy(), [0.0] * 4)


class AlltoallTest(tf.test.TestCase):
    def test_equal_splits_every_dtype(self):
        for dtype in MOVABLE:
            values = [rank_values(r, (2 * SIZE, 3), dtype) for r in range(SIZE)]
            for fn in [sd.alltoall, tf.function(sd.alltoall)]:
                with self.subTest(dtype=dtype.name):
                    out = fn(tf.constant(values[RANK], dtype))
                    expected = np.concatenate([values[src][2 * RANK : 2 * RANK + 2] for src in range(SIZE)])
                    self.assertAllEqual(out.numpy(), expected)

    def test_uneven_splits_return_received_splits(self):
        # Rank src sends (src + dst) % 3 rows to rank dst.
        def splits_of(src):
            return [(src + dst) % 3 for dst in range(SIZE)]

        values = [rank_values(r, (sum(splits_of(r)), 2), tf.float32) for r in range(SIZE)]
        out, received = sd.alltoall(tf.constant(values[RANK]), splits=splits_of(RANK))
        expected_rows = []
        for src in range(SIZE):
            start = sum(splits_of(src)[:RANK])
            expected_rows.append(values[src][start : start + splits_of(src)[RANK]])
        self.assertAllEqual(received, [splits_of(src)[RANK] for src in range(SIZE)])
        self.assertAllEqual(out.numpy(), np.concatenate(expected_rows))


class ReducescatterTest(tf.test.TestCase):
    def test_every_dtype_and_op_with_uneven_rows(self):
        rows = 2 * SIZE + 1
        for dtype in REDUCIBLE:
            for op in REDUCE_OPS:
                values = all_rank_values((rows, 2), dtype, op)
                expected = expected_reduction(values, op, dtype)
                start = sum(rows // SIZE + (r < rows % SIZE) for r in range(RANK))
                mine = rows // SIZE + (RANK < rows % SIZE)
                for fn in [sd.reducescatter, tf.function(sd.reducescatter)]:
                    with self.subTest(dtype=dtype.name, op=op):
                        out = fn(tf.constant(values[RANK], dtype), op=op)
                        self.assertAllClose(as_f64(out), expected[start : start + mine], **tolerance(dtype))

    def test_large_uneven_rows_through_shared_memory(self):
        # Over the shared-memory path's 256 KiB threshold and over several of its rounds, with
        # blocks of different lengths; scaled too, as the engine finishes Average and postscale.
        rows = 67 * SIZE + 3
        start = sum(rows // SIZE + (r < rows % SIZE) for r in range(RANK))
        mine = rows // SIZE + (RANK < rows % SIZE)
        for dtype in (tf.float32, tf.float16, tf.int64, tf.uint8):
            for op in (sd.Sum, sd.Average, sd.Max):
                if dtype.is_integer and op == sd.Average:
                    continue
                values = all_rank_values((rows, 4099), dtype, op)
                expected = expected_reduction(values, op, dtype)
                with self.subTest(dtype=dtype.name, op=op):
                    out = sd.reducescatter(tf.constant(values[RANK], dtype), op=op)
                    self.assertAllClose(as_f64(out), expected[start : start + mine], **tolerance(dtype))
        values = all_rank_values((rows, 4099), tf.float32, sd.Sum)
        scaled = sd.reducescatter(tf.constant(values[RANK]), op=sd.Average, prescale_factor=2.0, postscale_factor=0.5)
        expected = expected_reduction(values, sd.Average, tf.float32, prescale=2.0, postscale=0.5)
        self.assertAllClose(scaled, expected[start : start + mine], rtol=1e-5, atol=1e-5)


class HorovodGroupedAndInPlaceTest(tf.test.TestCase):
    """Horovod names beyond the basic collectives: grouped_allgather/reducescatter and broadcast_."""

    def test_grouped_allgather_every_dtype(self):
        values = {dtype: [rank_values(r, (r + 1, 2), dtype) for r in range(SIZE)] for dtype in MOVABLE}
        for fn in [sd.grouped_allgather, tf.function(sd.grouped_allgather)]:
            outs = fn([tf.constant(values[d][RANK], d) for d in MOVABLE], name="grouped_gather")
            for dtype, out in zip(MOVABLE, outs):
                with self.subTest(dtype=dtype.name, graph=fn is not sd.grouped_allgather):
                    self.assertEqual(out.dtype, dtype)
                    self.assertAllEqual(out.numpy(), np.concatenate(values[dtype]))

    def test_grouped_reducescatter_every_op(self):
        rows = 2 * SIZE + 1
        start = sum(rows // SIZE + (r < rows % SIZE) for r in range(RANK))
        mine = rows // SIZE + (RANK < rows % SIZE)
        for op in REDUCE_OPS:
            values = [all_rank_values((rows, 3), dtype, op) for dtype in (tf.float32, tf.int32)]
            outs = sd.grouped_reducescatter(
                [tf.constant(v[RANK], d) for v, d in zip(values, (tf.float32, tf.int32))], op=op
            )
            for out, v, dtype in zip(outs, values, (tf.float32, tf.int32)):
                with self.subTest(op=op, dtype=dtype.name):
                    expected = expected_reduction(v, op, dtype)[start : start + mine]
                    self.assertAllClose(as_f64(out), expected, **tolerance(dtype))

    def test_broadcast_in_place_returns_the_variables(self):
        import keras

        variables = [tf.Variable(tf.fill([3], float(RANK))), keras.Variable(np.full([2], RANK, np.int32))]
        returned = sd.broadcast_(variables, root_rank=SIZE - 1)
        self.assertIs(returned[0], variables[0])
        self.assertAllEqual(variables[0].numpy(), [SIZE - 1.0] * 3)
        self.assertAllEqual(variables[1].numpy(), [SIZE - 1] * 2)

        var = tf.Variable(tf.fill([2], float(RANK)))
        read = tf.function(lambda: sd.broadcast_([var], root_rank=0))()
        self.assertAllEqual(read[0], [0.0, 0.0])
        self.assertAllEqual(var.numpy(), [0.0, 0.0])

    def test_broadcast_in_place_in_a_v1_session(self):
        # Horovod's TF1 usage: the returned values carry the assignment.
        with tf.Graph().as_default():
            var = tf.compat.v1.Variable(tf.fill([3], float(RANK)), use_resource=True)
            out = sd.broadcast_([var], root_rank=SIZE - 1)
            bcast_all = sd.broadcast_global_variables(SIZE - 1)
            with tf.compat.v1.Session() as session:
                session.run(var.initializer)
                self.assertAllEqual(session.run(out)[0], [SIZE - 1.0] * 3)
                session.run(var.assign(tf.fill([3], float(RANK))))
                session.run(bcast_all)
                self.assertAllEqual(session.run(var), [SIZE - 1.0] * 3)
        with self.assertRaisesRegex(RuntimeError, "broadcast_variables"):
            sd.broadcast_global_variables(0)


class TopologyOpsTest(tf.test.TestCase):
    """rank_op() and friends are evaluated when the graph runs."""

    def test_values_eager_and_in_graph(self):
        ops = [sd.rank_op, sd.size_op, sd.local_rank_op, sd.local_size_op, sd.process_set_included_op]
        expected = [sd.rank(), sd.size(), sd.local_rank(), sd.local_size(), 1]
        graph = tf.function(lambda: [op() for op in ops])
        for got, eager_got, want in zip(graph(), [op() for op in ops], expected):
            self.assertEqual(got.dtype, tf.int32)
            self.assertEqual(int(got), want)
            self.assertEqual(int(eager_got), want)

    def test_value_is_read_at_run_time_not_trace_time(self):
        graph = tf.function(sd.rank_op).get_concrete_function().graph
        self.assertEqual([op.type for op in graph.get_operations() if op.type.startswith("Smdist")], ["SmdistRank"])

    def test_unknown_process_set_raises(self):
        for op in (sd.size_op, sd.process_set_included_op):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "process set 3 is not registered"):
                op(process_set_id=3)


class OrderingAndBarrierTest(tf.test.TestCase):
    def test_ranks_issue_collectives_in_different_orders(self):
        names = [f"ordered.{i}" for i in range(6)]
        if RANK % 2:
            names.reverse()
        results = {}

        def submit(name):
            results[name] = sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum, name=name).numpy()

        threads = []
        for name in names:
            t = threading.Thread(target=submit, args=(name,))
            t.start()
            threads.append(t)
            time.sleep(0.02)
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(len(results), len(names))
        for value in results.values():
            self.assertAllClose(value, [sum(range(SIZE))])

    def test_barrier(self):
        sd.barrier()
        tf.function(sd.barrier)()


class TimelineTest(tf.test.TestCase):
    def test_timeline_records_negotiation_fusion_and_transfer(self):
        import json
        import tempfile

        template = os.path.join(tempfile.mkdtemp(), "timeline.{rank}.json")
        path = template.format(rank=RANK)
        sd.start_timeline(template)
        sd.grouped_allreduce([tf.ones([3]), tf.ones([5])], op=sd.Sum, name="traced.group")
        sd.allgather(tf.ones([2]), name="traced.gather")
        sd.stop_timeline()
        with open(path) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        phases = {(rows[e["tid"]], e["name"]) for e in events if e["ph"] == "X"}
        for phase in ["NEGOTIATE", "COPY_IN_FUSION_BUFFER", "ALLREDUCE", "COPY_OUT_FUSION_BUFFER"]:
            self.assertIn(("traced.group.0", phase), phases)
            self.assertIn(("traced.group.1", phase), phases)
        self.assertIn(("traced.gather", "allgather"), phases)
        self.assertTrue(all(e["pid"] == RANK for e in events))

    def test_timeline_shows_which_allreduces_ran_in_place(self):
        # Inside tf.function TensorFlow hands a dying input buffer to the op as
        # its output. Each allreduce in a chain consumes the last one's result,
        # so all but the first (its input is a captured tensor Python still
        # holds) must run in place: this fails if the op keeps a reference to
        # its input past completion. 4 MiB: large enough for every path to
        # hand the result back from the engine while TensorFlow starts the
        # next op (where a late reference showed).
        import json
        import tempfile

        n = 1 << 20
        x = tf.fill([n], float(RANK + 1))

        @tf.function(autograph=False)
        def chain():
            t = x
            for i in range(8):
                t = sd.allreduce(t, op=sd.Sum, name=f"traced.chain.{i}")
            return t

        template = os.path.join(tempfile.mkdtemp(), "timeline.{rank}.json")
        path = template.format(rank=RANK)
        sd.start_timeline(template)
        for _ in range(3):
            result = chain()
        eager = sd.allreduce(x, op=sd.Sum, name="traced.eager")
        sd.stop_timeline()
        total = SIZE * (SIZE + 1) / 2
        self.assertAllEqual(result, np.full([n], total * SIZE**7, np.float32))
        self.assertAllEqual(eager, np.full([n], total, np.float32))
        with open(path) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        in_place = {}
        for e in events:
            if e["ph"] == "X" and e["name"] == "NEGOTIATE":
                in_place.setdefault(rows[e["tid"]], []).append(e["args"]["in_place"])
        self.assertEqual(in_place["traced.chain.0"], [False] * 3)
        for i in range(1, 8):
            self.assertEqual(in_place[f"traced.chain.{i}"], [True] * 3, f"traced.chain.{i}")
        self.assertEqual(in_place["traced.eager"], [False])  # Python still holds x


class GradientTest(tf.test.TestCase):
    """Gradients of collectives against hand-derived cross-rank formulas.

    Each rank's loss is sum(w_r * y) with its own weights w_r; the total loss is
    the sum over ranks, so dL/dy = sum_r w_r.
    """

    def _grad(self, fn, x):
        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            w = tf.cast(tf.fill(tf.shape(y), float(RANK + 1)), y.dtype)
            loss = tf.reduce_sum(w * y)
        return tape.gradient(loss, x).numpy()

    def test_allreduce_sum_average_grad(self):
        w_total = sum(r + 1 for r in range(SIZE))
        x = np.ones([3], np.float32)
        self.assertAllClose(self._grad(lambda t: sd.allreduce(t, op=sd.Sum), x), [w_total] * 3)
        self.assertAllClose(self._grad(lambda t: sd.allreduce(t, op=sd.Average), x), [w_total / SIZE] * 3)
        self.assertAllClose(
            self._grad(lambda t: sd.allreduce(t, op=sd.Sum, prescale_factor=2.0, postscale_factor=0.5), x), [w_total] * 3
        )

    def test_allreduce_max_min_grad_goes_to_extreme(self):
        w_total = sum(r + 1 for r in range(SIZE))
        x = np.array([float(RANK), -float(RANK)], np.float32)
        g = self._grad(lambda t: sd.allreduce(t, op=sd.Max), x)
        self.assertAllClose(g, [w_total if RANK == SIZE - 1 else 0.0, w_total / SIZE if SIZE == 1 else (w_total if RANK == 0 else 0.0)])
        g = self._grad(lambda t: sd.allreduce(t, op=sd.Min), np.full([2], 7.0, np.float32))
        self.assertAllClose(g, [w_total / SIZE] * 2)  # a tie: split evenly

    def test_allreduce_product_grad(self):
        w_total = sum(r + 1 for r in range(SIZE))
        xs = [np.array([r + 2.0, 0.0 if r == 0 else 1.5], np.float32) for r in range(SIZE)]
        g = self._grad(lambda t: sd.allreduce(t, op=sd.Product), xs[RANK])
        others0 = np.prod([xs[r][0] for r in range(SIZE) if r != RANK])
        others1 = np.prod([xs[r][1] for r in range(SIZE) if r != RANK])
        self.assertAllClose(g, [w_total * others0, w_total * others1], rtol=1e-5)

    def test_allgather_grad_averages_like_horovod(self):
        x = np.ones([RANK + 1, 2], np.float32)
        w_total = sum(r + 1 for r in range(SIZE))
        self.assertAllClose(self._grad(sd.allgather, x), np.full([RANK + 1, 2], w_total / SIZE))

    def test_allgather_grad_is_horovods_test_value(self):
        # Horovod's test: every rank passes the same upstream gradient, row block r filled with r;
        # each rank gets back its own block.
        sizes = [r + 1 for r in range(SIZE)]
        x = tf.ones([sizes[RANK], 3])
        upstream = tf.concat([tf.fill([n, 3], float(r)) for r, n in enumerate(sizes)], axis=0)
        with tf.GradientTape() as tape:
            tape.watch(x)
            gathered = sd.allgather(x)
        self.assertAllClose(tape.gradient(gathered, x, upstream), np.full([sizes[RANK], 3], float(RANK)))

    def test_broadcast_grad_averages_like_horovod(self):
        w_total = sum(r + 1 for r in range(SIZE))
        for root in range(SIZE):
            g = self._grad(lambda t: sd.broadcast(t, root), np.ones([2], np.float32))
            self.assertAllClose(g, [w_total / SIZE if RANK == root else 0.0] * 2)

    def test_broadcast_grad_in_tf_function_runs_on_every_rank(self):
        # The non-root ranks discard the averaged gradient; they must still take part in it.
        root = SIZE - 1

        @tf.function
        def grad(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(float(RANK + 1) * sd.broadcast(x, root))
            return tape.gradient(loss, x)

        w_total = sum(r + 1 for r in range(SIZE))
        for _ in range(2):
            self.assertAllClose(grad(tf.ones([3])), [w_total / SIZE if RANK == root else 0.0] * 3)

    def test_alltoall_grad(self):
        x = np.ones([SIZE, 2], np.float32)
        g = self._grad(sd.alltoall, x)
        # Row dst of rank src lands on rank dst, whose weight is dst + 1.
        self.assertAllClose(g, np.repeat(np.arange(1, SIZE + 1, dtype=np.float32)[:, None], 2, axis=1))

    def test_reducescatter_grad(self):
        x = np.ones([SIZE, 2], np.float32)
        # Horovod 0.28's scaling: Sum's gathered gradient times size(), Average's as is.
        weights = np.repeat(np.arange(1, SIZE + 1, dtype=np.float32)[:, None], 2, axis=1)
        g = self._grad(lambda t: sd.reducescatter(t, op=sd.Sum), x)
        self.assertAllClose(g, weights * SIZE)
        g = self._grad(lambda t: sd.reducescatter(t, op=sd.Average), x)
        self.assertAllClose(g, weights)
        g = self._grad(lambda t: sd.reducescatter(t, op=sd.Average, prescale_factor=2.0, postscale_factor=0.25), x)
        self.assertAllClose(g, weights * 0.5)

    def test_grad_in_tf_function(self):
        w_total = sum(r + 1 for r in range(SIZE))

        @tf.function
        def grad(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(float(RANK + 1) * sd.allreduce(x, op=sd.Sum))
            return tape.gradient(loss, x)

        self.assertAllClose(grad(tf.ones([3])), [w_total] * 3)


if __name__ == "__main__":
    tf.test.main()
