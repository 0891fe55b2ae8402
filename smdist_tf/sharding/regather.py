"""Stage 3: a layer's full weights exist only while it runs, and are gathered again for its backward.

In a ``tf.function`` a sharded weight's gather depends on its piece variable only, so
TensorFlow may run every gather at the start of the step, and the ops that read a
gathered weight keep it for the backward pass: the whole model, in full, for the whole
step. ``keras.layers.Layer.__call__`` is wrapped (a public method, monkeypatched once
per process by smdist_tf/keras/patches.py) so that, inside a ``tf.function``, a layer
whose own weights are all sharded with ``regather_in_backward``:

* gathers them once the input of the layer called before it in the same graph exists (a
  control dependency; its own input for the first): one layer ahead, so a layer's gathers
  overlap the previous layer's compute, and at most two layers' full weights are alive
  (``ParameterSharding(gather_ahead=False)``: its own input, one layer's), and
* keeps nothing of its call for the backward pass, the gathered weights included (a
  ``tf.custom_gradient`` that recomputes the call, as ``tf.recompute_grad`` does). The
  backward runs the call again once its incoming gradient exists, its gathers waiting
  for that recomputed input: not hoisted to the start of the step, and not one layer
  ahead either (the next layer's recomputed input exists as soon as its own incoming
  gradient does, so gathering ahead there let TensorFlow run several layers' backward
  gathers and full-size gradients at once: 1-2 layers more at the step's peak, and no
  faster, measured in benchmarks/README.md).

The backward runs each layer in turn: the recomputed call waits also until the layer
whose backward was traced before it (the layer after it in a chain) has reduce-scattered
its weights' gradients, and the weights' gradients are made once the input's gradient is,
so the gathered weights are freed first (a Dense layer's kernel gradient needs its input
and incoming gradient only, so TensorFlow made it beside the gathered kernel). So for
layers whose weights' gradients do not read the weights (Dense and Conv kernels,
Embedding tables), a layer's full weights and its full gradients are not alive at once,
and no two layers' are. Not for the first such layer in the graph: its input's gradient
is mostly unused, and waiting for it would make TensorFlow compute it.
``ParameterSharding(overlap_backward=True)`` drops these edges: about 1.5 layers more at
the step's peak, faster where cores are spare. The gradients come from two tapes over
the one recomputed call: a tape asked for the input's gradient alone would still run the
weights' gradient functions, and a reduce-scatter, a collective, is never pruned. XLA
ignores control edges: under ``jit_compile`` its own scheduler decides.

Layers with state of their own (BatchNormalization's moving statistics, a dropout's seed)
are left alone: recomputing them would update or draw twice. Every other layer keeps
Keras' own ``__call__``.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import keras
import tensorflow as tf

from smdist_tf import _compat
from smdist_tf.sharding.piece_optimizer import sharded_parameter

# Per graph being traced: the input of the regathering layer called last, which the next one's gathers wait for.
# Weak both ways: a tensor holds its graph, so a strong value would keep every traced graph alive.
_last_input: "weakref.WeakKeyDictionary[tf.Graph, weakref.ref]" = weakref.WeakKeyDictionary()


def previous_input(inputs: tf.Tensor) -> Optional[tf.Tensor]:
    """The input of the regathering layer called before the one called now with ``inputs`` in this graph (``None``
    for the first); records ``inputs`` for the next."""
    graph = tf.compat.v1.get_default_graph()
    last = _last_input.get(graph)
    _last_input[graph] = weakref.ref(inputs)
    return last() if last is not None else None


# Per graph being traced: the weights' gradients of the regathering layer whose backward was traced last, which
# is the layer after the one whose backward is traced next. Where a graph takes a second gradient, its first
# backward also waits for the first gradient's last reduce-scatters: more order, no cycle. Weak, as above.
_last_gradients: "weakref.WeakKeyDictionary[tf.Graph, list[weakref.ref]]" = weakref.WeakKeyDictionary()


def backward_traced(gradients: list) -> None:
    """Records the weights' gradients of the layer whose backward was just traced."""
    _last_gradients[tf.compat.v1.get_default_graph()] = [weakref.ref(g) for g in gradients if g is not None]


def gradients_of_the_layer_after() -> list:
    """The weights' gradients of the layer whose backward was traced last in this graph; forgets them."""
    refs = _last_gradients.pop(tf.compat.v1.get_default_graph(), [])
    return [g for g in (r() for r in refs) if g is not None]


def regathered_parameters(layer: Any) -> list:
    """The ``ShardedParameter``s of ``layer``'s weights if its call is run so that they are gathered again for the
    backward, else ``[]``."""
    weights = layer.trainable_weights
    if not weights or layer.non_trainable_weights or layer._flatten_layers(include_self=False, recursive=False):
        return []
    parameters = [sharded_parameter(w) for w in weights]
    return parameters if all(p is not None and p.regather_in_backward for p in parameters) else []


def patch_layer_call() -> None:
    """Wraps ``keras.layers.Layer.__call__`` (installed by smdist_tf/keras/patches.py)."""
    cls = keras.layers.Layer
    original = cls.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        parameters = (regathered_parameters(self) if len(args) == 1 and isinstance(args[0], tf.Tensor)
                      and tf.inside_function() and self.built else [])
        if not parameters:
            return original(self, *args, **kwargs)

        ahead = all(p.gather_ahead for p in parameters)
        in_turn = not any(p.overlap_backward for p in parameters)

        forward_outputs = []  # the call's own outputs, which carry the Keras masks the call set

        @tf.custom_gradient
        def recomputed(inputs: tf.Tensor) -> Any:
            # The forward's gathers wait for the previous layer's input (or this one's); nothing of the call is kept.
            previous = previous_input(inputs)
            with tf.control_dependencies([previous if ahead and previous is not None else inputs]):
                outputs = original(self, inputs, **kwargs)
            forward_outputs.append(outputs)

            def backward(*upstream: tf.Tensor, variables: Any = None) -> Any:
                variables = list(variables or [])
                # The call runs again once the gradient has come (and, in turn, once the layer after this one has
                # reduce-scattered its weights' gradients): its gathers wait for its recomputed input.
                waits = list(upstream) + (gradients_of_the_layer_after() if in_turn else [])
                with tf.control_dependencies(waits):
                    again = tf.identity(inputs)
                _compat.set_keras_mask(again, _compat.get_keras_mask(inputs))  # the call may read it
                # Two tapes, so that the inputs' gradient makes no reduce-scatter (a collective is never pruned).
                with tf.GradientTape(watch_accessed_variables=False) as weights_tape:
                    weights_tape.watch(variables)
                    with tf.GradientTape(watch_accessed_variables=False) as inputs_tape:
                        inputs_tape.watch(again)
                        with tf.control_dependencies([again]):
                            recomputed_outputs = original(self, again, **kwargs)
                grad_inputs = inputs_tape.gradient(recomputed_outputs, again, output_gradients=list(upstream),
                                                   unconnected_gradients=tf.UnconnectedGradients.ZERO)
                # In turn, the weights' full gradients are made once the gathered weights have been used up: by the
                # input's gradient, or for an integer input (an Embedding's ids) by the recomputed outputs. Not for
                # the first such layer: its input's gradient is mostly unused, and waiting for it would compute it.
                used_up = []
                if in_turn and previous is not None:
                    used_up = [grad_inputs] if again.dtype.is_floating else tf.nest.flatten(recomputed_outputs)
                with tf.control_dependencies(used_up):
                    grad_variables = weights_tape.gradient(recomputed_outputs, variables,
                                                           output_gradients=list(upstream),
                                                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
                backward_traced(grad_variables)
                return grad_inputs, grad_variables

            return outputs, backward

        outputs = recomputed(args[0])
        # The custom gradient's outputs are new tensors: give them the masks Keras set on the call's.
        for output, own in zip(tf.nest.flatten(outputs), tf.nest.flatten(forward_outputs[0])):
            _compat.set_keras_mask(output, _compat.get_keras_mask(own))
        return outputs

    __call__.__doc__ = original.__doc__
    cls.__call__ = __call__
