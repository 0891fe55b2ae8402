"""Real TF/Keras training through DistributedGradientTape and broadcast_variables.

Run on every rank by tests/test_training_multiprocess.py.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd

RANK, SIZE = sd.rank(), sd.size()


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])


def global_batch(step: int, per_rank: int):
    rng = np.random.default_rng(step)
    x = rng.normal(size=(per_rank * SIZE, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=(per_rank * SIZE,))
    return x, y


def gather_all(values) -> np.ndarray:
    return sd.allgather(tf.reshape(tf.constant(values), [1, -1])).numpy()


class DistributedGradientTapeTest(tf.test.TestCase):
    def test_data_parallel_sgd_equals_single_process_large_batch(self):
        per_rank, steps, lr = 4, 5, 0.1
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model = make_model(seed=100 + RANK)  # deliberately different on each rank
        sd.broadcast_variables(model.variables, root_rank=0)
        reference = make_model(seed=0)
        reference.set_weights(model.get_weights())

        @tf.function
        def distributed_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            grads = sd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
            for v, g in zip(model.trainable_variables, grads):
                v.assign_sub(lr * g)

        @tf.function
        def reference_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, reference(x))
            grads = tape.gradient(loss, reference.trainable_variables)
            for v, g in zip(reference.trainable_variables, grads):
                v.assign_sub(lr * g)

        for step in range(steps):
            x, y = global_batch(step, per_rank)
            mine = slice(RANK * per_rank, (RANK + 1) * per_rank)
            distributed_step(x[mine], y[mine])
            reference_step(x, y)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        # Bit-identical across ranks, not merely close.
        flat = np.concatenate([w.ravel() for w in model.get_weights()])
        everyone = gather_all(flat)
        for r in range(SIZE):
            self.assertAllEqual(everyone[r], flat)

    def test_keras_optimizer_training_keeps_ranks_in_sync(self):
        model = make_model(seed=200 + RANK)
        optimizer = keras.optimizers.Adam(0.01)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def step(x, y, first):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = sd.DistributedGradientTape(tape, compression=sd.Compression.fp16)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            if first:
                sd.broadcast_variables(model.variables, 0)
                sd.broadcast_variables(optimizer.variables, 0)
            return loss

        for i in range(4):
            x, y = global_batch(50 + i, 8)
            mine = slice(RANK * 8, (RANK + 1) * 8)
            step(x[mine], y[mine], i == 0)
        flat = np.concatenate([w.ravel() for w in model.get_weights()])
        everyone = gather_all(flat)
        for r in range(SIZE):
            self.assertAllEqual(everyone[r], flat)

    def test_none_sparse_and_sum(self):
        embedding = keras.layers.Embedding(10, 4)
        embedding.build((None,))
        dense = tf.Variable(tf.ones([4]))
        unused = tf.Variable(1.0)
        ids = tf.constant([RANK % 10, (RANK + 1) % 10])
        for sparse_as_dense in [False, True]:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(embedding(ids) * dense)
            tape = sd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense, op=sd.Sum)
            g_emb, g_dense, g_unused = tape.gradient(loss, [embedding.embeddings, dense, unused])
            self.assertIsNone(g_unused)
            self.assertEqual(isinstance(g_emb, tf.IndexedSlices), not sparse_as_dense)
            expected = np.zeros([10, 4], np.float32)
            for r in range(SIZE):
                expected[r % 10] += dense.numpy()
                expected[(r + 1) % 10] += dense.numpy()
            self.assertAllClose(tf.convert_to_tensor(g_emb), expected)
            # d/d(dense) summed over ranks of the looked-up rows.
            table = embedding.embeddings.numpy()
            want = sum(table[r % 10] + table[(r + 1) % 10] for r in range(SIZE))
            self.assertAllClose(g_dense, want, rtol=1e-5)

    def test_groups_predivide_and_tape_delegation(self):
        a, b, c = tf.Variable(1.0), tf.Variable(2.0), tf.Variable(3.0)
        for kwargs in [dict(num_groups=2), dict(groups=[[a], [c, b]]), dict(gradient_predivide_factor=2.0)]:
            with sd.DistributedGradientTape(tf.GradientTape(), **kwargs) as tape:
                loss = (RANK + 1.0) * (a + b * b + c * c * c)
            ga, gb, gc = tape.gradient(loss, [a, b, c])
            mean_w = sum(r + 1.0 for r in range(SIZE)) / SIZE
            self.assertAllClose([ga, gb, gc], [mean_w * 1.0, mean_w * 4.0, mean_w * 27.0], rtol=1e-6)

    def test_local_sources_are_not_reduced(self):
        # Horovod's local variables: a rank-specific head keeps its own (size-scaled) gradient.
        shared = tf.Variable(tf.ones([3]))
        head = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)
        head.build((None, 3))
        x = tf.fill([1, 3], float(RANK + 1))

        def grads(make_tape, scale_local_gradients=True):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(head(x * shared))
            return make_tape(tape, scale_local_gradients).gradient(loss, [shared, head.kernel])

        def registered(tape, scale):
            distributed = sd.DistributedGradientTape(tape, scale_local_gradients=scale)
            distributed.register_local_source(head.kernel)
            return distributed

        def partial(tape, scale):
            return sd.PartialDistributedGradientTape(tape, local_layers=head, scale_local_gradients=scale)

        mean_x = np.mean([r + 1.0 for r in range(SIZE)])
        for make_tape in (registered, partial):
            for scale in (True, False):
                with self.subTest(tape=make_tape.__name__, scale=scale):
                    g_shared, g_head = grads(make_tape, scale)
                    self.assertAllClose(g_shared, [mean_x] * 3)  # reduced: averaged over ranks
                    local = (RANK + 1.0) / (SIZE if scale else 1)
                    self.assertAllClose(g_head, [[local]] * 3)  # local: this rank's own
        with self.assertRaisesRegex(ValueError, "must be a ProcessSet"):
            sd.DistributedGradientTape(tf.GradientTape(), process_set=object())

    def test_invalid_tape_arguments(self):
        with self.assertRaisesRegex(ValueError, "Average or op=Sum"):
            sd.DistributedGradientTape(tf.GradientTape(), op=sd.Max)
        with self.assertRaisesRegex(ValueError, "needs op=Average"):
            sd.DistributedGradientTape(tf.GradientTape(), op=sd.Sum, gradient_predivide_factor=2.0)



class SyncBatchNormalizationTest(tf.test.TestCase):
    """Horovod's SyncBatchNormalization: statistics of the global batch, on every rank."""

    def test_training_output_and_moving_stats_match_the_global_batch(self):
        # Ranks hold batches of different sizes; the reference normalises their concatenation.
        batches = [np.random.default_rng(r).normal(3.0, 2.0, size=(r + 2, 5)).astype(np.float32) for r in range(SIZE)]
        sync = sd.SyncBatchNormalization(momentum=0.5)
        reference = keras.layers.BatchNormalization(momentum=0.5)
        x = tf.constant(batches[RANK])
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = sync(x, training=True)
            loss = tf.reduce_sum(out * tf.range(5, dtype=tf.float32))
        grad = tape.gradient(loss, x)
        everything = tf.constant(np.concatenate(batches))
        with tf.GradientTape() as ref_tape:
            ref_tape.watch(everything)
            ref_out = reference(everything, training=True)
            ref_loss = tf.reduce_sum(ref_out * tf.range(5, dtype=tf.float32))
        ref_grad = ref_tape.gradient(ref_loss, everything)
        mine = slice(sum(b.shape[0] for b in batches[:RANK]), sum(b.shape[0] for b in batches[: RANK + 1]))
        self.assertAllClose(out, ref_out[mine], rtol=1e-4, atol=1e-4)
        self.assertAllClose(sync.moving_mean, reference.moving_mean, rtol=1e-5)
        self.assertAllClose(sync.moving_variance, reference.moving_variance, rtol=1e-4)
        # The sum of the per-rank losses is the reference loss: its gradient reaches each rank's rows.
        self.assertAllClose(grad, ref_grad[mine], rtol=1e-3, atol=1e-4)

    def test_inference_uses_the_moving_averages(self):
        sync = sd.SyncBatchNormalization()
        x = tf.fill([2, 3], float(RANK))
        self.assertAllClose(sync(x, training=False), keras.layers.BatchNormalization()(x, training=False))


if __name__ == "__main__":
    tf.test.main()
