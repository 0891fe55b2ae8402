"""``OffloadActivations``: a layer's input waits in host memory between the passes, and gradients do not change.

Single process: the wrapper involves no communication (its use inside a pipeline is in
tests/mp/suite_pipeline.py). On this CPU-only machine the copies are host to host, so
placement is checked in the traced graph: what the backward reads of the forward.
"""

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

from smdist_tf.keras import OffloadActivations
from smdist_tf.pipeline.offload import HOST_DEVICE


def model(offload: bool, seed: int = 0) -> keras.Model:
    """Three blocks (a lone Dense, a Sequential of two, a Dense), offloaded or not; same weights either way."""
    keras.utils.set_random_seed(seed)
    blocks = [keras.layers.Dense(6, activation="tanh"),
              keras.Sequential([keras.layers.Dense(7, activation="relu"), keras.layers.Dense(6, activation="tanh")]),
              keras.layers.Dense(3)]
    if offload:
        blocks = [OffloadActivations(b) for b in blocks]
    return keras.Sequential([keras.Input((5,))] + blocks)


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)


def traced_step(m: keras.Model, x: np.ndarray, dy: np.ndarray):
    """Gradients of ``m`` (inputs and weights) for output gradient ``dy`` in a ``tf.function``, and its graph.

    Returns the gradients, the graph, and how many of its ops the forward made (ops are
    listed in creation order, so the rest are the backward's).
    """
    marks = {}

    @tf.function
    def step(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = m(x, training=True)
        marks["forward"] = len(tf.compat.v1.get_default_graph().get_operations())
        return tape.gradient(y, [x] + m.trainable_variables, output_gradients=dy)

    grads = step(tf.constant(x), tf.constant(dy))
    graph = step.get_concrete_function(tf.TensorSpec(x.shape), tf.TensorSpec(dy.shape)).graph
    return [g.numpy() for g in grads], graph, marks["forward"]


def saved_activations(graph, forward_count: int) -> list:
    """Floating-point tensors the forward computed and the backward reads: what is kept between the passes."""
    ops = graph.get_operations()
    forward = set(ops[:forward_count])
    saved = {id(t): t for op in ops[forward_count:] for t in op.inputs
             if t.op in forward and t.dtype.is_floating and t.op.type != "Placeholder"}
    return list(saved.values())


def is_host_copy(tensor) -> bool:
    return tensor.op.type == "Identity" and "offload_to_host" in tensor.op.name and \
        tf.DeviceSpec.from_string(tensor.op.device) == tf.DeviceSpec.from_string(HOST_DEVICE).replace(device_index=0)


class OffloadActivationsTest(tf.test.TestCase):
    def test_gradients_identical_in_a_tf_function_and_eagerly(self):
        x, dy = data()
        plain, _, _ = traced_step(model(False), x, dy)
        offloaded, _, _ = traced_step(model(True), x, dy)
        # The same ops on the same values: equal up to the last bits TensorFlow's CPU kernels may
        # vary in from one build of a model to the next (bit for bit in every run seen).
        for a, b in zip(plain, offloaded):
            self.assertAllClose(a, b, rtol=0, atol=1e-7)
        eager = []
        for offload in (False, True):
            m = model(offload)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(m(x, training=True) * dy)
            eager.append(tape.gradient(loss, m.trainable_variables))
        for a, b in zip(*eager):
            self.assertAllClose(a, b, rtol=0, atol=1e-7)

    def test_the_backward_reads_only_host_copies_of_the_block_inputs(self):
        x, dy = data(1)
        _, graph, forward = traced_step(model(True), x, dy)
        saved = saved_activations(graph, forward)
        # One host copy per block: each block's input, and nothing computed on the device.
        self.assertLen(saved, 3)
        for tensor in saved:
            self.assertTrue(is_host_copy(tensor), f"{tensor.name} on {tensor.op.device!r} is kept for the backward")
        # Each is brought back inside the backward, never earlier: the copy back waits for it.
        fetches = [op for op in graph.get_operations()[forward:] if op.type == "Identity" and
                   "fetch_from_host" in op.name and any(is_host_copy(t) for t in op.inputs)]
        self.assertLen(fetches, 3)
        for op in fetches:
            self.assertNotEmpty(op.control_inputs)
        # The same check on the unwrapped model fails: its backward reads device activations.
        _, graph, forward = traced_step(model(False), x, dy)
        self.assertFalse(all(is_host_copy(t) for t in saved_activations(graph, forward)))

    def test_fit_and_saving_round_trip(self):
        x, _ = data(2)
        y = np.arange(4) % 3
        losses = []
        for offload in (False, True):
            m = model(offload)
            m.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            losses.append(m.fit(x, y, epochs=3, batch_size=4, shuffle=False, verbose=0).history["loss"])
        self.assertAllClose(losses[0], losses[1], rtol=1e-6, atol=0)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "offloaded.keras")
            m.save(path)
            loaded = keras.models.load_model(path)
        self.assertIsInstance(loaded.layers[0], OffloadActivations)
        self.assertAllClose(loaded(x), m(x))

    def test_integer_inputs_get_no_gradient_and_weights_the_same(self):
        keras.utils.set_random_seed(3)
        tokens = np.array([[1, 2, 0], [3, 3, 1]], np.int32)
        grads = []
        for offload in (False, True):
            keras.utils.set_random_seed(3)
            embed = keras.layers.Embedding(4, 5)
            layer = OffloadActivations(embed) if offload else embed
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.tanh(layer(tokens)))
            grads.append(tape.gradient(loss, layer.trainable_variables))
        # Embedding gradients are IndexedSlices: compare them dense.
        self.assertAllClose(tf.convert_to_tensor(grads[0][0]), tf.convert_to_tensor(grads[1][0]), rtol=0, atol=1e-7)

    def test_a_layer_adding_losses_is_refused(self):
        with self.assertRaisesRegex(ValueError, "activity regularizer"):
            OffloadActivations(keras.layers.Dense(3, activity_regularizer="l2"))
