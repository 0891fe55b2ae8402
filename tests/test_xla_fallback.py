"""Keras' automatic XLA on a GPU, with a build whose collectives lower to XLA for the CPU only.

The GPU is simulated (this machine has none): ``xla_fallback.visible_gpus`` answers one GPU,
and ``lowered_xla_devices`` answers what the CPU or the GPU variant lowers for. Training
then really runs, with XLA or without, on the CPU.
"""

from __future__ import annotations

import warnings
from unittest import mock

import keras
import numpy as np
import tensorflow as tf

import smdist_tf.keras as hvd
from smdist_tf.keras import xla_fallback

ONE_GPU = ["/physical_device:GPU:0"]


def _model(optimizer: keras.optimizers.Optimizer, jit_compile: object) -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
    return model


def _fit(model: keras.Model) -> list[str]:
    x = np.arange(64, dtype=np.float32).reshape(16, 4) / 64
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0)
    return [str(w.message) for w in caught if "smdist_tf: model" in str(w.message)]


class XlaFallbackTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        hvd.init()

    def test_a_cpu_only_build_on_a_gpu_trains_without_xla_and_warns_once_naming_the_fix(self):
        model = _model(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), jit_compile=True)
        with mock.patch.object(xla_fallback, "visible_gpus", return_value=ONE_GPU), \
                mock.patch.object(xla_fallback, "lowered_xla_devices", return_value=("CPU",)):
            messages = _fit(model)
            self.assertFalse(model.jit_compile)
            self.assertEqual(_fit(model), [], "warned again for the same model")
        self.assertLen(messages, 1)
        self.assertIn("-DSMDIST_GPU_KERNELS=ON", messages[0])
        self.assertIn("jit_compile=False", messages[0])

    def test_the_gpu_variant_keeps_xla(self):
        model = _model(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), jit_compile=True)
        with mock.patch.object(xla_fallback, "visible_gpus", return_value=ONE_GPU), \
                mock.patch.object(xla_fallback, "lowered_xla_devices", return_value=("CPU", "GPU")):
            self.assertEqual(_fit(model), [])
        self.assertTrue(model.jit_compile)

    def test_without_a_gpu_nothing_changes(self):
        model = _model(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), jit_compile=True)
        with mock.patch.object(xla_fallback, "lowered_xla_devices", return_value=("CPU",)):
            self.assertEqual(_fit(model), [])
        self.assertTrue(model.jit_compile)

    def test_a_model_without_a_distributed_optimizer_keeps_xla(self):
        model = _model(keras.optimizers.SGD(0.1), jit_compile=True)
        self.assertFalse(xla_fallback.keep_jit_compile_where_lowered(model, gpus=ONE_GPU, lowered=("CPU",)))
        self.assertTrue(model.jit_compile)

    def test_a_distributed_optimizer_inside_a_loss_scale_optimizer_is_seen(self):
        inner = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
        model = _model(keras.optimizers.LossScaleOptimizer(inner), jit_compile=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.assertTrue(xla_fallback.keep_jit_compile_where_lowered(model, gpus=ONE_GPU, lowered=("CPU",)))
        self.assertFalse(model.jit_compile)

    def test_this_build_lowers_for_the_cpu_and_the_gpu_variant_for_both(self):
        self.assertEqual(xla_fallback.lowered_xla_devices({"gpu_kernels": False}), ("CPU",))
        self.assertEqual(xla_fallback.lowered_xla_devices({"gpu_kernels": True}), ("CPU", "GPU"))


if __name__ == "__main__":
    tf.test.main()
