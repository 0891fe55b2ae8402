"""Activation offloading: what the backward pass keeps is held in host memory between the forward and the backward.

TensorFlow keeps each op's saved tensors on the device the op ran on, and gives no hook
to move them. What can be moved is the input of a *recomputed* block: the backward
needs only that input, runs the block's forward again and differentiates it. So the
offloaded activations are checkpoints: ``PipelineModel(recompute=True,
offload_activations=True)`` holds each microbatch's stage inputs on the host, and
``OffloadActivations(layer)`` makes one layer such a block (see
docs/pipeline-parallelism.md#activation-offloading).

The copy to the host is a ``tf.identity`` placed on ``HOST_DEVICE``; the copy back is
one placed on the tensor's own device, held back by a control dependency on something
of the backward pass, since a graph runs an op as soon as its inputs exist and would
otherwise bring the tensor back during the forward.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Sequence

import keras
import tensorflow as tf

HOST_DEVICE = "/CPU:0"


def to_host(tensors: Sequence[tf.Tensor]) -> list:
    """Copies of ``tensors`` in host memory (on a GPU, a device-to-host copy each)."""
    with tf.name_scope("offload_to_host"), tf.device(HOST_DEVICE):
        return [tf.identity(t) for t in tensors]


def from_host(held: Sequence[tf.Tensor], devices: Sequence[str], after: Sequence[Any]) -> list:
    """Copies of the host tensors ``held`` back on ``devices``, made only once everything in ``after`` is done.

    A device of ``''`` (a graph tensor nobody placed) leaves the placement to TensorFlow,
    as for the tensor that was offloaded.
    """
    with tf.name_scope("fetch_from_host"), tf.control_dependencies([a for a in after if a is not None]):
        fetched = []
        for tensor, device in zip(held, devices):
            with tf.device(device) if device else contextlib.nullcontext():
                fetched.append(tf.identity(tensor))
        return fetched


def _added_losses(layer: keras.layers.Layer) -> list:
    return [loss for sub in layer._flatten_layers() for loss in sub._get_own_losses()]


@keras.saving.register_keras_serializable(package="smdist_tf")
class OffloadActivations(keras.layers.Wrapper):
    """Holds a layer's input in host memory between the forward and the backward pass, and nothing else of it.

    The forward runs the layer without recording it for differentiation and copies its
    input to the host (``/CPU:0``). When the backward pass reaches the layer, the input is
    copied back to its device, the layer's forward runs again on it, and that is
    differentiated. So the device holds none of the layer's activations between the
    passes (its output is the next layer's input, held by whatever holds that), at the
    cost of one more forward of the layer. Gradients are those of the unwrapped layer.

    Use it for non-pipeline models (``keras.Sequential([..., OffloadActivations(block),
    ...])``); in a ``PipelineModel``, ``offload_activations=True`` does the same for whole
    stages. On a CPU-only machine the copies are host to host: it runs and gives the same
    gradients, and saves nothing.

    Args:
        layer: the layer (or a ``keras.Sequential`` block) to run this way. Its
            ``training`` argument, when it has one, is passed on; it must not add losses
            in its call (``activity_regularizer``, ``add_loss``). Layers that draw random
            numbers (``Dropout``) draw new ones when the forward runs again, and layers
            that update state in training (``BatchNormalization``'s moving statistics)
            update it again.
        **kwargs: ``keras.layers.Layer`` arguments (``name``, ...).

    Raises:
        ValueError: the layer, or a layer inside it, has an activity regularizer; or it
            added losses when called (raised by that call).
    """

    def __init__(self, layer: keras.layers.Layer, **kwargs: Any):
        super().__init__(layer, **kwargs)
        if any(getattr(sub, "activity_regularizer", None) is not None for sub in layer._flatten_layers()):
            raise ValueError(f"OffloadActivations cannot wrap {layer.name!r}: it has an activity regularizer, a loss "
                             "added in its call, whose gradient would not reach its weights")
        self._passes_training = "training" in inspect.signature(layer.call).parameters

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.layer.compute_output_shape(input_shape)

    def compute_output_spec(self, inputs: Any, training: Any = None) -> Any:
        return self.layer.compute_output_spec(inputs)

    def call(self, inputs: Any, training: Any = None) -> Any:
        kwargs = {"training": training} if self._passes_training else {}
        flat_inputs = keras.tree.flatten(inputs)
        structure: list = []

        def run(values: list) -> list:
            outputs = self.layer(keras.tree.pack_sequence_as(inputs, values), **kwargs)
            structure[:] = [outputs]
            return keras.tree.flatten(outputs)

        @tf.custom_gradient
        def offloaded(*values):
            outputs = run(list(values))
            if _added_losses(self.layer):
                raise ValueError(f"OffloadActivations cannot wrap {self.layer.name!r}: it adds losses in its call, "
                                 "whose gradient would not reach its weights")
            held, devices = to_host(values), [v.device for v in values]

            def backward(*output_grads, variables=None):
                restored = from_host(held, devices, after=output_grads)
                float_inputs = [k for k, r in enumerate(restored) if r.dtype.is_floating]
                with tf.GradientTape() as tape:
                    for k in float_inputs:
                        tape.watch(restored[k])
                    recomputed = run(restored)
                sources = [restored[k] for k in float_inputs] + list(variables or [])
                # An output the loss does not use gets no gradient from the caller: zeros.
                grads_out = [tf.zeros_like(r) if g is None else g for r, g in zip(recomputed, output_grads)]
                grads = tape.gradient(recomputed, sources, output_gradients=grads_out,
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
                input_grads: list = [None] * len(restored)
                for k, g in zip(float_inputs, grads):
                    input_grads[k] = g
                if variables:
                    return input_grads, grads[len(float_inputs):]
                return input_grads

            return outputs, backward

        flat_outputs = offloaded(*flat_inputs)
        return keras.tree.pack_sequence_as(structure[0], list(flat_outputs))
