"""``GradientReducer`` is the one reduction behind the tape, both DistributedOptimizers and sharding.

Single process (a job of size 1): the settings, their validation and who holds a reducer.
The multi-rank results are checked by the suites (tests/mp/suite_training.py,
suite_keras.py, suite_sharding.py) and by docs/api.md's example at 2 ranks.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk


class GradientReducerTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sd.init()

    def test_bad_settings_fail_when_made(self):
        with self.assertRaisesRegex(ValueError, "op=Average or op=Sum"):
            sd.GradientReducer(op=sd.Max)
        with self.assertRaisesRegex(ValueError, "needs op=Average"):
            sd.GradientReducer(op=sd.Sum, gradient_predivide_factor=2.0)
        with self.assertRaisesRegex(ValueError, "num_groups must be >= 0"):
            sd.GradientReducer(num_groups=-1)
        with self.assertRaises(TypeError):
            sd.GradientReducer(compression="fp16")

    def test_predivide_becomes_prescale_and_postscale(self):
        self.assertEqual(sd.GradientReducer().scale_factors, (1.0, 1.0))
        self.assertEqual(sd.GradientReducer(gradient_predivide_factor=4.0).scale_factors, (0.25, 4.0))

    def test_reduce_keeps_order_nones_and_local_gradients(self):
        variables = [tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([2])), tf.Variable(tf.zeros([2]))]
        grads = [tf.constant([1.0, 2.0, 3.0]), None, tf.constant([4.0, 5.0])]
        # Sum at size 1 still runs the collective; predivide scales by 1/f and back by f.
        reducer = sd.GradientReducer(gradient_predivide_factor=2.0)
        out = reducer.reduce(grads, variables, local_variables=[variables[2]])
        self.assertAllClose(out[0], [1.0, 2.0, 3.0])
        self.assertIsNone(out[1])
        self.assertIs(out[2], grads[2])  # local, and at size 1 not scaled

    def test_tape_and_optimizers_hold_the_reducer_they_were_given(self):
        tape = sd.DistributedGradientTape(tf.GradientTape(), op=sd.Sum, num_groups=2)
        self.assertEqual((tape.reducer.op, tape.reducer.num_groups), (sd.Sum, 2))
        optimizer = sk.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=sd.Compression.fp16,
                                            backward_passes_per_step=2)
        self.assertIs(type(optimizer)._smdist_reducer.compression, sd.Compression.fp16)
        self.assertEqual(type(optimizer)._smdist_backward_passes_per_step, 2)
        partial = sk.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), gradient_predivide_factor=2.0)
        self.assertEqual(type(partial)._smdist_reducer.scale_factors, (0.5, 2.0))

    def test_sharding_reduce_scatters_as_the_reducer_reduces(self):
        settings = sd.sharding.ShardingSettings.of(sd.GradientReducer(gradient_predivide_factor=2.0), shard_gradients=True)
        self.assertEqual((settings.prescale_factor, settings.postscale_factor, settings.shard_gradients), (0.5, 2.0, True))
        with self.assertRaisesRegex(ValueError, "no wire compression"):
            sd.sharding.ShardingSettings.of(sd.GradientReducer(compression=sd.Compression.fp16))
        tape = sd.DistributedGradientTape(tf.GradientTape(), compression=sd.Compression.bf16)
        with self.assertRaisesRegex(ValueError, "no wire compression"):
            sd.sharding.apply_sharded_gradients(tape, keras.optimizers.SGD(0.1), tf.constant(0.0), [])

    def test_adasum_reduces_gradients_but_not_by_reduce_scatter(self):
        tape = sd.DistributedGradientTape(tf.GradientTape(), op=sd.Adasum)
        self.assertEqual(tape.reducer.op, sd.Adasum)
        # At size 1 Adasum is the identity; with a factor the engine runs it.
        variables = [tf.Variable(tf.zeros([3]))]
        reduced = sd.GradientReducer(op=sd.Adasum).reduce([tf.constant([1.0, -2.0, 3.0])], variables)
        self.assertAllClose(reduced[0], [1.0, -2.0, 3.0])
        self.assertAllClose(sd.allreduce(tf.constant([1.0, -2.0]), op=sd.Adasum, prescale_factor=2.0), [2.0, -4.0])
        with self.assertRaisesRegex(ValueError, "Adasum is an allreduce op"):
            sk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=sd.Adasum, shard_optimizer_state=True)
        with self.assertRaisesRegex(ValueError, "needs op=Average"):
            sd.GradientReducer(op=sd.Adasum, gradient_predivide_factor=2.0)

    def test_reduced_gradients_train_like_local_ones_at_size_one(self):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        x = np.ones((4, 3), np.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x))
        local = tape.gradient(loss, model.trainable_variables)
        reduced = sd.GradientReducer(op=sd.Sum).reduce(local, model.trainable_variables)
        for a, b in zip(local, reduced):
            self.assertAllClose(a, b)
