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
* runs under ``tf.recompute_grad``: nothing of its call, the gathered weights included,
  is kept for the backward pass; the backward runs the call again, its gathers waiting
  for its own recomputed input, which ``recompute_grad`` makes depend on the incoming
  gradient. So they are not hoisted to the start of the step, and they do not start one
  layer ahead either: the next layer's recomputed input exists as soon as its own
  incoming gradient does, so gathering ahead there let TensorFlow run several layers'
  backward gathers and full-size gradients at once (1-2 layers more at the step's peak,
  and no faster, measured in benchmarks/README.md).

Layers with state of their own (BatchNormalization's moving statistics, a dropout's seed)
are left alone: recomputing them would update or draw twice. Every other layer keeps
Keras' own ``__call__``.
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
import tensorflow as tf

from smdist_tf.sharding.piece_optimizer import sharded_parameter

# Per graph being traced: the input of the regathering layer called last, which the next one's gathers wait for.
# Weak both ways: a tensor holds its graph, so a strong value would keep every traced graph alive.
_last_input: "weakref.WeakKeyDictionary[tf.Graph, weakref.ref]" = weakref.WeakKeyDictionary()


def gathers_wait_for(inputs: tf.Tensor, ahead: bool) -> tf.Tensor:
    """What the gathers of a layer called with ``inputs`` wait for: with ``ahead``, the previous such layer's input
    in this graph, else ``inputs``."""
    graph = tf.compat.v1.get_default_graph()
    last = _last_input.get(graph)
    previous = last() if last is not None else None
    _last_input[graph] = weakref.ref(inputs)
    return previous if ahead and previous is not None else inputs


def regathers(layer: Any) -> bool:
    """Whether ``layer``'s call is run so that its weights are gathered again for the backward."""
    weights = layer.trainable_weights
    if not weights or layer.non_trainable_weights or layer._flatten_layers(include_self=False, recursive=False):
        return False
    parameters = [sharded_parameter(w) for w in weights]
    return all(p is not None and p.regather_in_backward for p in parameters)


def patch_layer_call() -> None:
    """Wraps ``keras.layers.Layer.__call__`` (installed by smdist_tf/keras/patches.py)."""
    cls = keras.layers.Layer
    original = cls.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not (len(args) == 1 and isinstance(args[0], tf.Tensor) and tf.inside_function() and self.built
                and regathers(self)):
            return original(self, *args, **kwargs)

        ahead = all(sharded_parameter(w).gather_ahead for w in self.trainable_weights)
        runs = [0]  # recompute_grad runs `run` for the forward, then again for each gradient taken

        def run(inputs: tf.Tensor) -> Any:
            # The forward's gathers wait for the previous layer's input (or this one's); the backward's for this
            # one's recomputed input, which waits for the incoming gradient.
            forward = runs[0] == 0
            runs[0] += 1
            with tf.control_dependencies([gathers_wait_for(inputs, ahead and forward)]):
                return original(self, inputs, **kwargs)

        return tf.recompute_grad(run)(args[0])

    __call__.__doc__ = original.__doc__
    cls.__call__ = __call__
