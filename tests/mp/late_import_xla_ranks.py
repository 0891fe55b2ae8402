"""What the ranks run in tests/test_xla_multiprocess.py's late-import test (not a pytest module).

TensorFlow work comes first (an eager op, a Keras model), as in a script that builds its
model before ``import smdist_tf`` or a notebook: TensorFlow has then set up XLA before
our op library loads, and the lowerings must still compile. Prints ``rank R: late import
XLA ok`` when every check passed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.ones([2]) * 2  # sets up TensorFlow's devices, and XLA's compilation kernels with them
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)])

import smdist_tf as sd  # noqa: E402

CALL = 'custom_call_target="smdist_collective"'


def main() -> None:
    sd.init()
    rank, size = sd.rank(), sd.size()

    @tf.function(jit_compile=True)
    def summed(x):
        return sd.allreduce(x, op=sd.Sum, name="late_import.sum")

    x = tf.fill([3], float(rank + 1))
    np.testing.assert_allclose(summed(x).numpy(), np.full(3, size * (size + 1) / 2))
    assert CALL in summed.experimental_get_compiler_ir(x)(stage="hlo")

    optimizer = keras.optimizers.SGD(0.1)

    @tf.function(jit_compile=True)
    def train_step(features):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(features))
        tape = sd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return grads[0]

    features = tf.fill([1, 4], float(rank))
    # d loss / d kernel is this rank's features; the tape averages them over the ranks.
    np.testing.assert_allclose(train_step(features).numpy(), np.full((4, 1), (size - 1) / 2))
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), np.full((4, 1), 1 - 0.1 * (size - 1) / 2))
    assert CALL in train_step.experimental_get_compiler_ir(features)(stage="hlo")
    print(f"rank {rank}: late import XLA ok", flush=True)


if __name__ == "__main__":
    main()
