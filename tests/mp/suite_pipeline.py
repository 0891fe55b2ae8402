"""Pipeline parallelism: point-to-point ops, PipelineModel gradients, fit, checkpoints and errors.

Run on every rank by tests/test_pipeline_multiprocess.py (2 and 4 ranks). Every test
runs on every rank in the same order, so collectives and messages pair up.
"""

from __future__ import annotations

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf import pipeline
from smdist_tf.keras import PipelineModel
from smdist_tf.pipeline import partition, schedule

RANK, SIZE = sd.rank(), sd.size()
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# (num_stages, data-parallel replicas) this world size can run.
CONFIGS = [(SIZE, 1)] + ([(SIZE // 2, 2)] if SIZE >= 4 else [])


def data(n: int, seed: int = 0, features: int = 8):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = ((x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)).astype(np.int64)
    return x, y


def mlp(seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(10, activation="tanh") for _ in range(3)]
                            + [keras.layers.Dense(3)])


def skip_model(seed: int = 2) -> keras.Model:
    """Skips that cross stage boundaries: from the first dense to the end, and from the input to the end."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8,))
    a = keras.layers.Dense(10, activation="tanh", name="a")(inp)
    b = keras.layers.Dense(10, activation="tanh", name="b")(a)
    c = keras.layers.Dense(10, activation="tanh", name="c")(b)
    s = keras.layers.Add(name="add")([a, c])
    j = keras.layers.Concatenate(name="join")([s, inp])
    return keras.Model(inp, keras.layers.Dense(3, name="out")(j))


def tied_model(seed: int = 3) -> keras.Model:
    """One Dense layer called at the start and near the end: its weights live in two stages."""
    keras.utils.set_random_seed(seed)
    shared = keras.layers.Dense(8, activation="tanh", name="shared")
    inp = keras.Input((8,))
    h = shared(inp)
    h = keras.layers.Dense(8, activation="tanh", name="mid1")(h)
    h = keras.layers.Dense(8, activation="tanh", name="mid2")(h)
    h = shared(h)
    return keras.Model(inp, keras.layers.Dense(3, name="head")(h))


def reference(model_fn, x, y):
    """Loss and gradients of the unpartitioned model on the whole batch."""
    model = model_fn()
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x))
    return float(loss), tape.gradient(loss, model.trainable_variables)


class PointToPointTest(tf.test.TestCase):
    def test_ring_exchange_with_changing_shapes_both_sending_first(self):
        right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        for shape in ([3, 2], [3, 2], [2, 3], [6], [0, 4], [300, 300]):
            pipeline.send([tf.fill(shape, float(RANK)), tf.constant([RANK], tf.int64)], right, tag=3)
            got, who = pipeline.recv([tf.float32, tf.int64], left, tag=3)
            self.assertEqual(got.shape, shape)
            self.assertAllEqual(who, [left])
            if got.shape.num_elements():
                self.assertAllEqual(tf.reduce_max(got), float(left))

    def test_tags_are_independent_and_ordered(self):
        peer = RANK ^ 1
        for i in range(3):
            pipeline.send([tf.constant([i], tf.int32)], peer, tag=10)
            pipeline.send([tf.constant([100 + i], tf.int32)], peer, tag=11)
        late = [int(pipeline.recv([tf.int32], peer, tag=11)[0][0]) for _ in range(3)]
        early = [int(pipeline.recv([tf.int32], peer, tag=10)[0][0]) for _ in range(3)]
        self.assertEqual(early, [0, 1, 2])
        self.assertEqual(late, [100, 101, 102])

    def test_inside_tf_function_with_shape_hints_and_half(self):
        peer = RANK ^ 1

        @tf.function
        def swap(x):
            pipeline.send([x], peer, tag=4)
            return pipeline.recv([tf.float16], peer, tag=4, shapes=[[None, 4]])[0]

        for rows in (2, 2, 5):
            got = swap(tf.fill([rows, 4], tf.cast(RANK, tf.float16)))
            self.assertEqual(got.shape, [rows, 4])
            self.assertEqual(float(got[0, 0]), float(peer))

    def test_mismatched_dtype_and_bad_peer_raise(self):
        peer = RANK ^ 1
        pipeline.send([tf.ones([2])], peer, tag=5)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "float32, expected int32"):
            pipeline.recv([tf.int32], peer, tag=5)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "is not a rank"):
            pipeline.send([tf.ones([1])], SIZE + 3, tag=5)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "itself"):
            pipeline.recv([tf.float32], RANK, tag=5)


class ScheduleAndPartitionTest(tf.test.TestCase):
    def test_schedules_hold_at_most_their_bound(self):
        for p in (2, 4):
            for m in (1, 3, 8):
                for s in range(p):
                    one = schedule.build("1f1b", s, p, m)
                    gp = schedule.build("gpipe", s, p, m)
                    for actions in (one, gp):
                        self.assertEqual(sorted(actions), sorted([schedule.Action(k, i) for k in "FB" for i in range(m)]))
                    self.assertEqual(schedule.max_in_flight(one), min(p - s, m))
                    self.assertEqual(schedule.max_in_flight(gp), m)
        self.assertAlmostEqual(schedule.theoretical_bubble(4, 8), 3 / 11)

    def test_partition_specs(self):
        names = ["a", "b", "c", "d", "e"]
        self.assertEqual(partition.resolve("auto", names, [100, 0, 100, 0, 100], 3), [1, 2, 2])
        self.assertEqual(partition.resolve("auto", names, [300, 10, 10, 10, 10], 2), [1, 4])
        self.assertEqual(partition.resolve("uniform", names, [1] * 5, 2), [3, 2])
        self.assertEqual(partition.resolve([1, 4], names, [1] * 5, 2), [1, 4])
        self.assertEqual(partition.resolve(["a", "d"], names, [1] * 5, 2), [3, 2])
        with self.assertRaisesRegex(ValueError, "more than the model's 5 layers"):
            partition.resolve("auto", names, [1] * 5, 6)
        with self.assertRaisesRegex(ValueError, "add up"):
            partition.resolve([2, 2], names, [1] * 5, 2)
        with self.assertRaisesRegex(ValueError, "does not have"):
            partition.resolve(["a", "zz"], names, [1] * 5, 2)


class PipelineGradientTest(tf.test.TestCase):
    def check_model(self, model_fn, part):
        x, y = data(16, seed=4)
        want_loss, want_grads = reference(model_fn, x, y)
        for stages, replicas in CONFIGS:
            for sched in ("1f1b", "gpipe"):
                inner = model_fn()
                pm = PipelineModel(inner, num_stages=stages, num_microbatches=2, schedule=sched, partition=part,
                                   verbose=False)
                self.assertEqual((pm.pp_size(), pm.dp_size()), (stages, replicas))
                pm.compile(optimizer="sgd", loss=LOSS)
                loss, pairs = pm.pipeline_gradients(x, y)
                where = f"{stages} stages x {replicas}, {sched}"
                self.assertAllClose(float(loss), want_loss, rtol=1e-5, msg=where)
                positions = [id(v) for v in inner.trainable_variables]
                for variable, grad in pairs:
                    self.assertAllClose(grad, want_grads[positions.index(id(variable))], rtol=1e-4, atol=1e-6,
                                        msg=f"{where}: {variable.path}")

    def test_sequential_mlp(self):
        self.check_model(mlp, "auto")

    def test_functional_skips_across_stages(self):
        self.check_model(skip_model, "uniform")

    def test_tied_weights_summed_over_stages(self):
        self.check_model(tied_model, "uniform")
        # The shared layer really is replicated in two stages.
        pm = PipelineModel(tied_model(), num_stages=SIZE, num_microbatches=1, partition="uniform", verbose=False)
        holds = float("shared/kernel" in " ".join(v.path for v in pm.stage_variables))
        self.assertEqual(float(sd.allreduce(tf.constant(holds), op=sd.Sum, name="tied.holders")), 2.0)

    def test_recompute_gives_the_same_gradients(self):
        x, y = data(8, seed=5)
        _, want = reference(mlp, x, y)
        inner = mlp()
        pm = PipelineModel(inner, num_stages=SIZE, num_microbatches=4, recompute=True, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        _, pairs = pm.pipeline_gradients(x, y)
        positions = [id(v) for v in inner.trainable_variables]
        for variable, grad in pairs:
            self.assertAllClose(grad, want[positions.index(id(variable))], rtol=1e-4, atol=1e-6)


class PipelineTrainingTest(tf.test.TestCase):
    def test_fit_converges_on_digits_with_global_logs(self):
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = (digits.data[:1536] / 16.0).astype(np.float32)
        y = digits.target[:1536].astype(np.int64)
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(32, activation="relu"), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(10)])
        stages = 2
        pm = PipelineModel(model, num_stages=stages, num_microbatches=4, schedule="1f1b", verbose=False)
        pm.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, metrics=["accuracy"])
        history = pm.fit(x, y, batch_size=64, epochs=5, shuffle=False, verbose=0)
        losses = history.history["loss"]
        self.assertLess(losses[-1], 0.5 * losses[0])
        loss, accuracy = pm.evaluate(x, y, batch_size=256, verbose=0)
        self.assertGreater(accuracy, 0.85)
        predictions = pm.predict(x[:256], batch_size=128, verbose=0)
        self.assertEqual(predictions.shape, (256, 10))
        # Callbacks must decide alike: every rank saw the same numbers.
        mine = tf.constant([losses[-1], loss, accuracy, float(predictions.sum())], tf.float64)
        everyone = sd.allgather(mine[None], name="digits.logs").numpy()
        for r in range(SIZE):
            self.assertAllEqual(everyone[r], mine.numpy(), msg=f"rank {r} saw other logs")

    def test_checkpoint_from_two_stages_loads_into_other_stage_counts(self):
        x, y = data(16, seed=6)
        directory = sd.broadcast_object(tempfile.mkdtemp(prefix="pipeline-ckpt-") if RANK == 0 else None)
        path = os.path.join(directory, "two-stages.weights.h5")
        pm = PipelineModel(mlp(), num_stages=2, num_microbatches=2, verbose=False)
        pm.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
        pm.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        pm.save_weights(path)
        stage_file = pm.save_stage_weights(directory)
        expected = pm.predict(x, batch_size=8, verbose=0)
        plain = mlp(seed=99)
        plain.load_weights(path)
        self.assertAllClose(plain.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
        for stages in [1, 2, 4]:
            if SIZE % stages or stages > 4:
                continue
            other = PipelineModel(mlp(seed=50 + stages), num_stages=stages, num_microbatches=2, verbose=False)
            other.compile(loss=LOSS)
            other.load_weights(path)
            self.assertAllClose(other.predict(x, batch_size=8, verbose=0), expected, rtol=1e-5, atol=1e-6,
                                msg=f"{stages} stages")
        again = PipelineModel(mlp(seed=98), num_stages=2, num_microbatches=2, verbose=False)
        again.compile(loss=LOSS)
        again.load_stage_weights(directory)
        self.assertTrue(os.path.exists(stage_file))
        self.assertAllClose(again.predict(x, batch_size=8, verbose=0), expected, rtol=1e-5, atol=1e-6)


class PipelineErrorTest(tf.test.TestCase):
    """Each mistake raises the same clear error on every rank, and the job goes on."""

    def test_bad_inputs_raise_everywhere(self):
        one_layer = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
        with self.assertRaisesRegex(ValueError, "more than the model's 1 layers"):
            PipelineModel(one_layer, num_stages=SIZE, num_microbatches=2, verbose=False)
        with self.assertRaisesRegex(ValueError, "not a multiple of num_stages=3"):
            PipelineModel(mlp(), num_stages=3, num_microbatches=2, verbose=False)
        with self.assertRaisesRegex(ValueError, "unknown schedule"):
            PipelineModel(mlp(), num_stages=SIZE, num_microbatches=2, schedule="zigzag", verbose=False)
        pm = PipelineModel(mlp(), num_stages=2, num_microbatches=4, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        x, y = data(12)
        divisor = 4 * (SIZE // 2)
        if 12 % divisor:
            with self.assertRaisesRegex(ValueError, f"batch size 12 does not divide by .* = {divisor}"):
                pm.pipeline_gradients(x, y)
        with self.assertRaisesRegex(ValueError, "batch size 6 does not divide"):
            pm.fit(x, y, batch_size=6, epochs=1, verbose=0)
        # Different data on different ranks is caught before it corrupts training.
        x16, y16 = data(16, seed=RANK)
        pm._verify_batch = True
        with self.assertRaisesRegex(ValueError, "ranks were given different batches"):
            pm.pipeline_gradients(x16, y16)
        self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name="pipeline.healthy"), [SIZE, SIZE])

    def test_rank_helpers(self):
        pm = PipelineModel(mlp(), num_stages=2, num_microbatches=1, verbose=False)
        self.assertEqual(pipeline.pp_size(), 2)
        self.assertEqual(pipeline.dp_size(), SIZE // 2)
        self.assertEqual(pipeline.pp_rank(), RANK % 2)
        self.assertEqual(pipeline.dp_rank(), RANK // 2)
        self.assertIn(RANK, pipeline.pp_group())
        self.assertEqual(pipeline.dp_group(), list(range(RANK % 2, SIZE, 2)))
        self.assertEqual(pm.pp_rank(), pipeline.pp_rank())
