"""XLA: collectives inside ``jit_compile`` functions equal the same calls without XLA.

Run on every rank by tests/test_xla_multiprocess.py, at 2 and 4 ranks.

Each collective lowers to one custom call into the engine (cc_ops/tf/xla_collective_*.cc).
Checked here: every dtype and reduce op against a local result and the non-XLA path, the
other collectives, process sets and compression, fusion and the response cache for
XLA-issued work, training (a custom loop with DistributedGradientTape, ``fit`` with
DistributedOptimizer and with DataParallelStrategy), and that errors reach every rank.
"""

from __future__ import annotations

import json
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk
from smdist_tf import _runtime as _rt
from tests.mp.adasum_reference import adasum
from tests.mp.rank_counts import at_two_ranks_only
from tests.mp.sync_assertions import SyncAssertions

REDUCIBLE = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
             tf.float64]
OPS = {"Sum": sd.Sum, "Average": sd.Average, "Min": sd.Min, "Max": sd.Max, "Product": sd.Product}


def rank_values(rank: int, shape: tuple = (3, 4)) -> np.ndarray:
    """Small non-negative values (a product over 4 ranks fits int8), different on every rank."""
    return ((np.arange(np.prod(shape)).reshape(shape) + rank) % 3 + 1).astype(np.float64)


def local_reduction(op: str, dtype: tf.DType, size: int) -> np.ndarray:
    """What every rank expects, computed from all ranks' inputs here."""
    stacked = np.stack([rank_values(r) for r in range(size)])
    if op == "Average":
        total = stacked.sum(axis=0)
        return total // size if dtype.is_integer else total / size
    return {"Sum": np.sum, "Min": np.min, "Max": np.max, "Product": np.prod}[op](stacked, axis=0)


def hlo(fn, *args) -> str:
    return fn.experimental_get_compiler_ir(*args)(stage="hlo")


def make_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="tanh"),
                             keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(1)])


def rank_data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(sd.rank()).normal(size=(64, 16)).astype(np.float32)
    return x, np.sin(x[:, :1]) * 2.0


def flat(arrays: list) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


class XlaTest(SyncAssertions):
    def test_allreduce_of_every_dtype_and_op_equals_the_local_result_and_the_graph_path(self):
        size = sd.size()
        for dtype in REDUCIBLE:
            x = tf.constant(rank_values(sd.rank()), dtype)
            ops = {name: op for name, op in OPS.items() if not (name == "Product" and dtype == tf.float16)}

            def reduce_all(t):
                return [sd.allreduce(t, op=op, name=f"every.{dtype.name}.{name}") for name, op in ops.items()]

            compiled = tf.function(reduce_all, jit_compile=True)
            self.assertIn('custom_call_target="smdist_collective"', hlo(compiled, x))
            with_xla = compiled(x)
            without_xla = tf.function(reduce_all)(x)
            for (name, _), got, graph in zip(ops.items(), with_xla, without_xla):
                with self.subTest(dtype=dtype.name, op=name):
                    self.assertEqual(got.dtype, dtype)
                    expected = local_reduction(name, dtype, size)
                    tolerance = 1e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-6
                    self.assertAllClose(tf.cast(got, tf.float64), expected, rtol=tolerance, atol=tolerance)
                    self.assertAllEqual(got, graph)

    def test_allgather_broadcast_alltoall_and_reducescatter_equal_the_graph_path(self):
        size, rank = sd.size(), sd.rank()
        for dtype in REDUCIBLE + [tf.bool]:
            with self.subTest(dtype=dtype.name):
                rows = rank_values(rank, (2 * size, 3))
                x = tf.constant(rows > 1 if dtype == tf.bool else rows, dtype)

                def collectives(t):
                    out = [sd.allgather(t, name=f"gather.{dtype.name}"),
                           sd.broadcast(t, root_rank=size - 1, name=f"bcast.{dtype.name}"),
                           sd.alltoall(t, name=f"a2a.{dtype.name}")]
                    if dtype != tf.bool:
                        out.append(sd.reducescatter(t, op=sd.Sum, name=f"rs.{dtype.name}"))
                    return out

                with_xla = tf.function(collectives, jit_compile=True)(x)
                without_xla = tf.function(collectives)(x)
                for got, graph in zip(with_xla, without_xla):
                    self.assertEqual(got.shape, graph.shape)
                    self.assertAllEqual(got, graph)
                gathered = np.concatenate([rank_values(r, (2 * size, 3)) for r in range(size)])
                self.assertAllEqual(tf.cast(with_xla[0], tf.float64),
                                    gathered > 1 if dtype == tf.bool else gathered)
                self.assertAllEqual(with_xla[1], tf.constant(rank_values(size - 1, (2 * size, 3)) > 1
                                                             if dtype == tf.bool else rank_values(size - 1, (2 * size, 3)),
                                                             dtype))

    def test_uneven_reducescatter_and_grouped_broadcast(self):
        size = sd.size()
        x = tf.constant(rank_values(sd.rank(), (2 * size + 1, 2)))

        @tf.function(jit_compile=True)
        def run(t):
            scattered = sd.reducescatter(t, op=sd.Average, name="rs.uneven")
            a, b = sd.grouped_broadcast([t, t * 2.0], root_rank=0, name="bcast.group")
            return scattered, a, b

        scattered, a, b = run(x)
        self.assertAllClose(scattered, tf.function(lambda t: sd.reducescatter(t, op=sd.Average, name="rs.uneven.g"))(x))
        self.assertAllEqual(a, rank_values(0, (2 * size + 1, 2)))
        self.assertAllEqual(b, rank_values(0, (2 * size + 1, 2)) * 2.0)

    def test_prescale_postscale_and_compression(self):
        size = sd.size()
        x = tf.constant(rank_values(sd.rank()))

        @tf.function(jit_compile=True)
        def scaled(t):
            return (sd.allreduce(t, op=sd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled"),
                    sd.allreduce(t, op=sd.Average, compression=sd.Compression.fp16, name="compressed"))

        total = np.sum([rank_values(r) for r in range(size)], axis=0)
        got_scaled, got_compressed = scaled(x)
        self.assertAllClose(got_scaled, total * 1.5)
        self.assertAllClose(got_compressed, total / size, rtol=1e-3)

    def test_adasum_equals_the_pairwise_reference(self):
        values = [rank_values(r) * (r + 1) for r in range(sd.size())]
        compiled = tf.function(lambda t: sd.allreduce(t, op=sd.Adasum, name="adasum"), jit_compile=True)
        self.assertAllClose(compiled(tf.constant(values[sd.rank()])), adasum(values), rtol=1e-12, atol=1e-12)

    def test_process_set(self):
        size, rank = sd.size(), sd.rank()
        if size < 4:
            self.skipTest("a set of two ranks beside the world needs 4 ranks")
        ps = sd.add_process_set(list(range(0, size, 2)))
        try:
            x = tf.constant(rank_values(rank))

            @tf.function(jit_compile=True)
            def in_set(t):
                return (sd.allreduce(t, op=sd.Sum, process_set=ps, name="set.sum"),
                        sd.allgather(t, process_set=ps, name="set.gather"),
                        sd.reducescatter(t, op=sd.Sum, process_set=ps, name="set.scatter"))

            if rank in ps.ranks:
                summed, gathered, scattered = in_set(x)
                expected = np.sum([rank_values(r) for r in ps.ranks], axis=0)
                self.assertAllClose(summed, expected)
                self.assertAllEqual(gathered, np.concatenate([rank_values(r) for r in ps.ranks]))
                rows = ps.ranks.index(rank)
                self.assertAllClose(scattered, np.array_split(expected, len(ps.ranks))[rows])
        finally:
            sd.remove_process_set(ps)

    def test_grouped_allreduce_is_one_fused_request_and_is_cached(self):
        template = os.path.join(sd.broadcast_object(tempfile.mkdtemp() if sd.rank() == 0 else None),
                                "timeline.{rank}.json")
        tensors = [tf.fill([n], float(sd.rank() + 1)) for n in (5, 7, 11)]

        @tf.function(jit_compile=True)
        def grouped(*ts):
            return sd.grouped_allreduce(list(ts), op=sd.Sum, name="xla.group")

        self.assertEqual(hlo(grouped, *tensors).count('custom_call_target="smdist_collective"'), 1)
        grouped(*tensors)
        sd.start_timeline(template)
        for _ in range(3):
            results = grouped(*tensors)
        sd.stop_timeline()
        total = sd.size() * (sd.size() + 1) / 2
        for n, r in zip((5, 7, 11), results):
            self.assertAllEqual(r, np.full([n], total, np.float32))
        with open(template.format(rank=sd.rank())) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        fused = {(rows[e["tid"]], e["args"]["fused"]) for e in events if e["ph"] == "X" and e["name"] == "ALLREDUCE"}
        self.assertEqual(fused, {(f"xla.group.{i}", 3) for i in range(3)})
        self.assertTrue({"xla.group.0", "xla.group.1", "xla.group.2"} <= set(_rt._cached_names()))

    def test_custom_loop_with_distributed_gradient_tape(self):
        x, y = rank_data()

        def train(jit_compile: bool) -> np.ndarray:
            model, optimizer = make_model(), keras.optimizers.SGD(0.1)

            @tf.function(jit_compile=jit_compile)
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(xb) - yb))
                tape = sd.DistributedGradientTape(tape)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            for i in range(4):
                step(x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])
            if jit_compile:
                self.assertIn('custom_call_target="smdist_collective"', hlo(step, x[:16], y[:16]))
            return flat(model.get_weights())

        with_xla, without_xla = train(True), train(False)
        self.assertAllClose(with_xla, without_xla, rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(with_xla)

    def fit_weights(self, jit_compile: bool, strategy: bool) -> np.ndarray:
        x, y = rank_data()
        if strategy:
            with sd.DataParallelStrategy().scope():
                model = make_model()
                model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=jit_compile)
        else:
            model = make_model()
            model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse",
                          jit_compile=jit_compile)
        self.assertEqual(model.jit_compile, jit_compile)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return flat(model.get_weights())

    @at_two_ranks_only("XLA compiles each rank's step alike; the lowered collectives run at 4 ranks in the tests above")
    def test_fit_with_jit_compile_equals_fit_without(self):
        for strategy in (False, True):
            with self.subTest(strategy=strategy):
                with_xla = self.fit_weights(True, strategy)
                # XLA fuses the step's arithmetic in another order: equal to rounding, which Adam amplifies a little.
                self.assertAllClose(with_xla, self.fit_weights(False, strategy), rtol=1e-3, atol=1e-4)
                self.assert_identical_on_all_ranks(with_xla)

    def test_allgather_of_unequal_first_dimensions_fails_on_every_rank(self):
        x = tf.ones([sd.rank() + 1, 2])
        gather = tf.function(lambda t: sd.allgather(t, name="xla.ragged"), jit_compile=True)
        with self.assertRaisesRegex(tf.errors.OpError, "mismatched first dimensions"):
            gather(x)
        self.assert_engine_healthy()

    def test_mismatched_allreduce_shapes_fail_on_every_rank(self):
        x = tf.ones([2 + sd.rank()])
        reduce = tf.function(lambda t: sd.allreduce(t, op=sd.Sum, name="xla.mismatch"), jit_compile=True)
        with self.assertRaisesRegex(tf.errors.OpError, "mismatched shapes"):
            reduce(x)
        self.assert_engine_healthy()

    def test_alltoall_with_uneven_splits_is_refused_when_compiled(self):
        size = sd.size()
        splits = [2] + [1] * (size - 2) + [0]
        x = tf.ones([sum(splits), 3])
        exchange = tf.function(lambda t: sd.alltoall(t, splits=splits, name="xla.uneven"), jit_compile=True)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "takes only equal splits"):
            exchange(x)
        self.assert_engine_healthy()


if __name__ == "__main__":
    tf.test.main()
