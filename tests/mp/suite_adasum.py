"""op=Adasum: the engine's vector-halving Adasum against the NumPy pairwise reference, and its errors; and
DataParallelStrategy(gradient_op=Adasum) against a DistributedGradientTape(op=Adasum) loop on the same per-rank batches.

Run on every rank by tests/test_adasum_multiprocess.py (in the shared plain job; under XLA in suite_xla.py,
with tf-keras in suite_tf_keras.py, whose jobs pay those start-ups already). Inputs are
deterministic per rank (collective_expectations.rank_values), so every rank computes the expected
result of all ranks with tests/mp/adasum_reference.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as hvd
from tests.mp.adasum_reference import adasum
from tests.mp.collective_expectations import rank_values, tolerance
from tests.mp.engine_restart import restart_engine
from tests.mp.sync_assertions import SyncAssertions

RANK, SIZE = sd.rank(), sd.size()
FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
# A scalar; fewer elements than ranks (empty halves at 4 ranks); odd lengths (uneven halves); a matrix.
SHAPES = [(), (1,), (3,), (37,), (4, 5)]


def every_rank(shape, dtype=tf.float64, seed=0) -> list:
    return [rank_values(r, shape, dtype, seed=seed) for r in range(SIZE)]


def as_f64(x) -> np.ndarray:
    return tf.cast(x, tf.float64).numpy()


def gather_all(values: np.ndarray) -> np.ndarray:
    """Every rank's ``values``, stacked in rank order."""
    return sd.allgather(tf.constant(values)[tf.newaxis]).numpy()


class AdasumAllreduceTest(SyncAssertions):
    def test_matches_the_pairwise_reference_for_each_float_dtype(self):
        for dtype in FLOATS:
            for shape in SHAPES:
                with self.subTest(dtype=dtype.name, shape=shape):
                    values = every_rank(shape, dtype, seed=11)
                    out = sd.allreduce(tf.constant(values[RANK]), op=sd.Adasum, name=f"adasum.{dtype.name}.{shape}")
                    self.assertEqual(out.dtype, dtype)
                    self.assertEqual(out.shape, shape)
                    self.assertAllClose(as_f64(out), adasum(values, dtype), **tolerance(dtype))
        # The reference is no Sum or Average in disguise.
        values = every_rank((37,), seed=11)
        self.assertNotAllClose(adasum(values), np.sum(values, axis=0))
        self.assertNotAllClose(adasum(values), np.mean(values, axis=0))

    def test_identical_vectors_give_the_vector_and_orthogonal_ones_their_sum(self):
        same = rank_values(0, (9,), tf.float32, seed=3)  # every rank's
        out = sd.allreduce(tf.constant(same), op=sd.Adasum, name="adasum.identical")
        self.assertAllClose(out, same, rtol=1e-6, atol=1e-6)
        orthogonal = np.zeros(SIZE, np.float32)
        orthogonal[RANK] = RANK + 1.0
        out = sd.allreduce(tf.constant(orthogonal), op=sd.Adasum, name="adasum.orthogonal")
        self.assertAllClose(out, np.arange(1.0, SIZE + 1.0), rtol=1e-6, atol=1e-6)

    def test_zero_vectors_contribute_nothing_to_the_coefficients(self):
        zero_ranks = {0} if SIZE == 2 else {0, 1}  # at 4 ranks a whole pair: a zero vector one level up too
        values = [np.zeros(7) if r in zero_ranks else v for r, v in enumerate(every_rank((7,), seed=5))]
        out = sd.allreduce(tf.constant(values[RANK]), op=sd.Adasum, name="adasum.some_zero")
        self.assertAllClose(out, adasum(values), rtol=1e-12, atol=1e-12)
        if SIZE == 2:
            self.assertAllClose(out, values[1])  # adasum(0, b) = b
        out = sd.allreduce(tf.zeros([7], tf.float64), op=sd.Adasum, name="adasum.all_zero")
        self.assertAllEqual(out, np.zeros(7))  # no 0/0

    def test_grouped_tensors_get_their_own_coefficients(self):
        shapes = [(33,), (5, 3), (2,)]
        values = [every_rank(shape, seed=20 + i) for i, shape in enumerate(shapes)]
        values[1] = [v * 1000.0 for v in values[1]]  # a large tensor would dominate shared coefficients
        values[2] = [values[2][0]] * SIZE  # identical on every rank: its own Adasum is itself
        mine = [tf.constant(v[RANK]) for v in values]
        expected = [adasum(v) for v in values]
        graph = tf.function(lambda ts: sd.grouped_allreduce(ts, op=sd.Adasum, name="adasum.grouped.graph"))
        for how, reduce in (("eager", lambda ts: sd.grouped_allreduce(ts, op=sd.Adasum, name="adasum.grouped")),
                            ("tf.function", graph)):
            with self.subTest(how=how):
                out = reduce(mine)
                for got, want in zip(out, expected):
                    self.assertAllClose(got, want, rtol=1e-12, atol=1e-12)
        # Coefficients shared over the fused tensors would give something else.
        flat = adasum([np.concatenate([v[r].ravel() for v in values]) for r in range(SIZE)])
        self.assertNotAllClose(flat, np.concatenate([e.ravel() for e in expected]))

    def test_prescale_and_postscale_factors(self):
        values = every_rank((6,), seed=8)
        out = sd.allreduce(tf.constant(values[RANK]), op=sd.Adasum, prescale_factor=0.5, postscale_factor=3.0,
                           name="adasum.scaled")
        self.assertAllClose(out, 3.0 * adasum([0.5 * v for v in values]), rtol=1e-12, atol=1e-12)

    def test_a_rank_inside_join_counts_as_a_zero_vector(self):
        values = every_rank((5,), seed=17)
        if RANK == 0:
            sd.join()
        else:
            out = sd.allreduce(tf.constant(values[RANK]), op=sd.Adasum, name="adasum.joined")
            sd.join()
            self.assertAllClose(out, adasum([np.zeros(5)] + values[1:]), rtol=1e-12, atol=1e-12)

    def test_horovod_keras_allreduce_takes_adasum(self):
        values = every_rank((4,), tf.float32, seed=9)
        out = hvd.allreduce(values[RANK], op=hvd.Adasum, name="adasum.hvd_keras")
        self.assertAllClose(out, adasum(values, tf.float32), rtol=1e-6, atol=1e-6)


class AdasumErrorTest(SyncAssertions):
    def test_integer_tensors_fail_on_every_rank(self):
        for dtype in (tf.int32, tf.int64, tf.uint8):
            with self.subTest(dtype=dtype.name):
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError, f"floating-point.*not {dtype.name}"):
                    sd.allreduce(tf.ones([3], dtype), op=sd.Adasum, name=f"adasum.int.{dtype.name}")
        self.assert_engine_healthy()

    def test_wire_compression_fails_on_every_rank(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"Adasum does not combine with wire compression \(fp16\)"):
            sd.allreduce(tf.ones([3]), op=sd.Adasum, compression=sd.Compression.fp16, name="adasum.fp16")
        self.assert_engine_healthy()

    def test_sparse_gradients_reducescatter_and_its_gradient_are_refused(self):
        slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([RANK]), tf.constant([SIZE, 2]))
        with self.assertRaisesRegex(NotImplementedError, "Adasum does not reduce tf.IndexedSlices.*sparse_as_dense"):
            sd.allreduce(slices, op=sd.Adasum)
        with self.assertRaisesRegex(ValueError, "reducescatter does not take op=Adasum"):
            sd.reducescatter(tf.ones([SIZE]), op=sd.Adasum)
        x = tf.Variable([1.0, 2.0])
        with tf.GradientTape() as tape:
            y = sd.allreduce(x, op=sd.Adasum, name="adasum.differentiated")
        with self.assertRaisesRegex(NotImplementedError, "gradient of allreduce with op=Adasum"):
            tape.gradient(y, x)
        self.assert_engine_healthy()

    @pytest.mark.skipif(SIZE < 4, reason="a set of 3 ranks and a second set of 2 need 4 ranks")
    def test_process_sets_of_two_ranks_work_and_of_three_fail_on_every_member(self):
        three, two, other_two = sd.ProcessSet([0, 1, 2]), sd.ProcessSet([1, 3]), sd.ProcessSet([0, 2])
        restart_engine(process_sets=[three, two, other_two])
        try:
            values = every_rank((5,), seed=13)
            grads = every_ranks_gradients(dense_model())  # on every rank, before the sets go their ways
            if three.included():
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "power-of-two number of ranks.*has 3"):
                    sd.allreduce(tf.constant(values[RANK]), op=sd.Adasum, process_set=three, name="adasum.set3")
                with self.assertRaisesRegex(ValueError, "power-of-two number of replicas; this one has 3"):
                    sd.DataParallelStrategy(process_set=three, gradient_op=sd.Adasum)
            if two.included():
                out = sd.allreduce(tf.constant(values[RANK]), op=sd.Adasum, process_set=two, name="adasum.set2")
                self.assertAllClose(out, adasum([values[1], values[3]]), rtol=1e-12, atol=1e-12)
            # A strategy over each set of two, side by side: one step applies the Adasum of the members' own
            # gradients. Every rank builds a model, so Keras names the later models alike on every rank (graph
            # collectives are matched by node names).
            pair = two if two.included() else other_two
            strategy = sd.DataParallelStrategy(process_set=pair, gradient_op=sd.Adasum)
            with strategy.scope():
                model = dense_model()
                model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            before = [w.numpy() for w in model.trainable_variables]
            model.train_on_batch(*rank_batch())
            for w, w0, g in zip(model.trainable_variables, before, grads):
                self.assertAllClose(w, w0 - 0.1 * adasum([g[r] for r in pair.ranks], tf.float32), rtol=1e-5, atol=1e-6)
            sd.barrier()
        finally:
            restart_engine()
        self.assert_engine_healthy()


def dense_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(2)])
    # Every rank starts from the same weights.
    model.set_weights([rank_values(0, w.shape, tf.float32, seed=40 + i) / 4 for i, w in enumerate(model.weights)])
    return model


def rank_batch():
    return rank_values(RANK, (6, 4), tf.float32, seed=50), rank_values(RANK, (6, 2), tf.float32, seed=51)


def every_ranks_gradients(model: keras.Model) -> list:
    """Per variable, every rank's local gradients on its own batch, stacked in rank order."""
    x, y = rank_batch()
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x))
    return [gather_all(g.numpy()) for g in tape.gradient(loss, model.trainable_variables)]


class AdasumTrainingTest(SyncAssertions):
    def test_distributed_gradient_tape_in_a_train_step(self):
        model = dense_model()
        local = every_ranks_gradients(model)
        expected = [adasum(list(g), tf.float32) for g in local]
        x, y = rank_batch()

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(y, model(x))
            return sd.DistributedGradientTape(tape, op=sd.Adasum).gradient(loss, model.trainable_variables)

        grads = step()
        for got, want in zip(grads, expected):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        # What Average would have given is something else.
        average = [np.mean(g, axis=0) for g in local]
        self.assertNotAllClose(np.concatenate([g.ravel() for g in average]),
                               np.concatenate([g.ravel() for g in expected]))

    def test_distributed_optimizer_step_applies_the_adasum_of_the_gradients(self):
        lr = 0.1
        model = dense_model()
        before = [w.numpy() for w in model.trainable_variables]
        expected = [adasum(list(g), tf.float32) for g in every_ranks_gradients(model)]
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr), op=sd.Adasum), loss="mse")
        model.train_on_batch(*rank_batch())
        for w, w0, g in zip(model.trainable_variables, before, expected):
            self.assertAllClose(w, w0 - lr * g, rtol=1e-5, atol=1e-6)
            self.assert_identical_on_all_ranks(w.numpy().ravel())


STEPS, LOCAL_BATCH, VOCABULARY, LR = 3, 4, 6, 0.1


def embedding_model() -> keras.Model:
    """An embedding (sparse gradients, which Adasum takes dense) and two dense layers, alike on every rank."""
    model = keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(VOCABULARY, 3),
                              keras.layers.Flatten(), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(2)])
    model.set_weights([rank_values(0, w.shape, tf.float32, seed=60 + i) / 4 for i, w in enumerate(model.weights)])
    return model


def rank_rows(rank: int) -> tuple:
    """Rank ``rank``'s ``STEPS`` batches of ``LOCAL_BATCH`` rows, as one array each of ids and targets."""
    ids = np.random.default_rng(70 + rank).integers(0, VOCABULARY, (STEPS * LOCAL_BATCH, 2)).astype(np.int32)
    return ids, rank_values(rank, (STEPS * LOCAL_BATCH, 2), tf.float32, seed=71)


class SamplesSeen(keras.metrics.Metric):
    """The number of samples seen: every rank's, summed, under a strategy (Adasum of equal counts gives one's)."""

    def __init__(self, name: str = "samples") -> None:
        super().__init__(name=name)
        self.count = self.add_variable((), initializer="zeros", aggregation="sum", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(tf.cast(tf.shape(y_true)[0], self.dtype))

    def result(self):
        return tf.convert_to_tensor(self.count)


def train_with_a_distributed_tape(op: int) -> tuple:
    """A custom loop over this rank's batches with ``DistributedGradientTape(op=op)``: the model and, per step,
    this rank's loss and mean absolute error."""
    model, optimizer = embedding_model(), keras.optimizers.SGD(LR)
    ids, targets = rank_rows(RANK)

    def step(x, y):  # eagerly: cheaper than tracing for a few steps
        with tf.GradientTape() as tape:
            prediction = model(x)
            loss = keras.losses.MeanSquaredError()(y, prediction)
        tape = sd.DistributedGradientTape(tape, op=op, sparse_as_dense=True)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss, tf.reduce_mean(tf.abs(y - prediction))

    logs = [step(ids[i * LOCAL_BATCH:(i + 1) * LOCAL_BATCH], targets[i * LOCAL_BATCH:(i + 1) * LOCAL_BATCH])
            for i in range(STEPS)]
    return model, np.array([[float(loss), float(mae)] for loss, mae in logs])


def flat_weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([w.ravel() for w in model.get_weights()])


class AdasumStrategyTest(SyncAssertions):
    def test_fit_equals_a_distributed_tape_loop_and_keeps_global_metrics(self):
        strategy = sd.DataParallelStrategy(gradient_op=sd.Adasum)
        self.assertEqual(strategy.gradient_op, sd.Adasum)
        data = strategy.distribute_datasets_from_function(
            lambda ctx: tf.data.Dataset.from_tensor_slices(rank_rows(ctx.input_pipeline_id)).batch(LOCAL_BATCH))
        with strategy.scope():
            model = embedding_model()
            model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse", metrics=["mae", SamplesSeen()])
        history = model.fit(data, epochs=1, verbose=0).history
        self.assert_identical_on_all_ranks(flat_weights(model))

        adasum_loop, logs = train_with_a_distributed_tape(sd.Adasum)
        self.assertAllClose(flat_weights(model), flat_weights(adasum_loop), rtol=1e-5, atol=1e-5)
        average_loop, _ = train_with_a_distributed_tape(sd.Average)
        self.assertNotAllClose(flat_weights(model), flat_weights(average_loop), rtol=1e-3, atol=1e-3)
        # The logs average every rank's steps, and the sample count sums them: no Adasum there.
        every_ranks = gather_all(logs).reshape(-1, 2)
        self.assertAllClose([history["loss"][0], history["mae"][0]], every_ranks.mean(axis=0), rtol=1e-5, atol=1e-6)
        self.assertEqual(history["samples"], [SIZE * STEPS * LOCAL_BATCH])

    def test_the_strategy_refuses_what_its_adasum_cannot_do(self):
        cases = [
            (dict(gradient_op=sd.Sum), "takes Average or Adasum, not Sum"),
            (dict(gradient_op=sd.Adasum, compression=sd.Compression.fp16), r"takes no wire compression \(FP16"),
            (dict(gradient_op=sd.Adasum, shard_optimizer_state=True), "does not combine with shard_optimizer_state"),
            (dict(gradient_op=sd.Adasum, shard_gradients=True), "does not combine with shard_optimizer_state"),
        ]
        for kwargs, message in cases:
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}):
                with self.assertRaisesRegex(ValueError, message):
                    sd.DataParallelStrategy(**kwargs)
        self.assertEqual(sd.DataParallelStrategy().gradient_op, sd.Average)
        self.assert_engine_healthy()
