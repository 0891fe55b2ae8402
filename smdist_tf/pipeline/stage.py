"""One rank's pipeline stage: compiled forward and backward of a microbatch, and the activations it holds."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import tensorflow as tf

from smdist_tf.pipeline.graph import LayerCall, ModelGraph
from smdist_tf.pipeline.point_to_point import recv, send
from smdist_tf.pipeline.topology import PipelineTopology

# Activations flow down the pipeline on one tag, their gradients up on another;
# per (peer, tag) messages arrive in send order, which every schedule keeps.
TAG_ACTIVATIONS = 1
TAG_GRADIENTS = 2
TAG_CHECKPOINT = 7  # save_weights: each variable from its first holder to rank 0


@dataclasses.dataclass
class ScheduleStats:
    """What one step of the schedule cost this stage (for benchmarks)."""

    seconds: float = 0.0  # the whole schedule
    waiting_seconds: float = 0.0  # blocked in receives: the bubble as this stage sees it
    held: int = 0
    peak_held: int = 0  # most microbatches of activations held at once
    held_bytes: int = 0
    peak_held_bytes: int = 0  # bytes of boundary tensors (inputs + outputs) held at the peak

    def hold(self, nbytes: int) -> None:
        self.held += 1
        self.held_bytes += nbytes
        self.peak_held = max(self.peak_held, self.held)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def release(self, nbytes: int) -> None:
        self.held -= 1
        self.held_bytes -= nbytes


def _nbytes(tensors: list) -> int:
    return sum(int(tf.size(t)) * t.dtype.size for t in tensors)


class StageRunner:
    """Runs this rank's layer calls for one microbatch at a time and talks to the neighbouring stages.

    Forward and backward are compiled: the forward is a ``tf.function`` called under a
    ``GradientTape``, so TensorFlow keeps the intermediates it needs and the backward
    is the function's compiled gradient. With ``recompute`` only the stage inputs are
    held and the forward runs again inside a compiled backward.
    """

    def __init__(self, graph: ModelGraph, calls: list[LayerCall], in_ids: list[int], out_ids: list[int],
                 stage: int, topology: PipelineTopology, variables: list, recompute: bool = False):
        self.graph, self.calls, self.in_ids, self.out_ids = graph, calls, in_ids, out_ids
        self.stage, self.num_stages = stage, topology.pp_size
        self.is_first, self.is_last = stage == 0, stage == topology.pp_size - 1
        self.prev_rank = topology.stage_rank(stage - 1) if not self.is_first else None
        self.next_rank = topology.stage_rank(stage + 1) if not self.is_last else None
        self.variables = variables
        self.recompute = recompute
        self.in_dtypes = [tf.as_dtype(graph.tensors[t].dtype) for t in in_ids]
        self.in_shapes = [tf.TensorShape(graph.tensors[t].shape) for t in in_ids]
        self.out_dtypes = [tf.as_dtype(graph.tensors[t].dtype) for t in out_ids]
        # Gradients flow only through floating-point boundary tensors.
        self.float_in = [k for k, d in enumerate(self.in_dtypes) if d.is_floating]
        self.float_out = [k for k, d in enumerate(self.out_dtypes) if d.is_floating]
        self.loss_fn: Optional[Callable[..., tf.Tensor]] = None
        # Weight regularizers this stage counts (a tied layer's only in its first stage,
        # so the sum over stages counts each once, as the unpartitioned model.losses does).
        self.regularized: list = []
        self._forward_fn = tf.function(self._forward, reduce_retracing=True)
        self._recompute_fn = tf.function(self._recompute_gradients, reduce_retracing=True)
        self._regularization_fn = tf.function(self._regularization, reduce_retracing=True)
        self.stats = ScheduleStats()
        self.begin_step()

    # -- compiled pieces -------------------------------------------------------------------------

    def _forward(self, inputs: list, y: Any, sample_weight: Any, loss_factor: tf.Tensor, aux_factor: tf.Tensor,
                 training: bool):
        """The stage's layer calls; returns the boundary outputs and this stage's share of the objective.

        The objective is ``loss_factor × loss(y, y_pred, sample_weight)`` on the last stage,
        plus ``aux_factor ×`` the losses the layers added (activity regularizers, ``add_loss``).
        """
        outputs, added = self.graph.run(self.calls, self.in_ids, inputs, self.out_ids, training)
        objective = tf.zeros([], tf.float32)
        if self.is_last and y is not None:
            y_pred = outputs[0] if len(outputs) == 1 else outputs
            objective = loss_factor * tf.cast(self.loss_fn(y, y_pred, sample_weight=sample_weight), tf.float32)
        if added:
            objective = objective + aux_factor * tf.add_n([tf.cast(tf.reduce_sum(a), tf.float32) for a in added])
        return outputs, objective

    def _recompute_gradients(self, inputs: list, y: Any, sample_weight: Any, loss_factor: tf.Tensor,
                             aux_factor: tf.Tensor, dy: list, loss_scale: tf.Tensor):
        with tf.GradientTape() as tape:
            for k in self.float_in:
                tape.watch(inputs[k])
            outputs, objective = self._forward(inputs, y, sample_weight, loss_factor, aux_factor, True)
        return self._gradients(tape, inputs, outputs, objective, dy, loss_scale)

    def _gradients(self, tape, inputs, outputs, objective, dy, loss_scale):
        sources = [inputs[k] for k in self.float_in] + list(self.variables)
        # The objective (the loss on the last stage, added losses on any stage) is scaled
        # through its output gradient: the tape has stopped recording.
        targets, output_gradients = [objective], [loss_scale]
        if not self.is_last:
            targets += [outputs[k] for k in self.float_out]
            output_gradients += list(dy)
        grads = tape.gradient(targets, sources, output_gradients=output_gradients)
        # Unconnected sources get zeros (Keras variables report dtype as a string, which
        # TensorFlow's own zero-filling cannot handle).
        return [tf.zeros(s.shape, tf.as_dtype(s.dtype)) if g is None else g for s, g in zip(sources, grads)]

    def _regularization(self, loss_scale: tf.Tensor, training: bool):
        """Sum of this stage's weight-regularization losses, and (training) its scaled gradients."""
        with tf.GradientTape() as tape:
            total = tf.add_n([tf.cast(v.regularizer(v), tf.float32) for v in self.regularized])
        if not training:
            return total, []
        grads = tape.gradient(total, list(self.variables), output_gradients=loss_scale)
        return total, [tf.zeros(v.shape, tf.as_dtype(v.dtype)) if g is None else g for v, g in zip(self.variables, grads)]

    def regularization(self, loss_scale: tf.Tensor, training: bool) -> tuple[tf.Tensor, list]:
        """Weight-regularization loss of this stage and its gradients (added once per step, not per microbatch)."""
        if not self.regularized:
            return tf.zeros([], tf.float32), []
        return self._regularization_fn(loss_scale, training)

    # -- one step --------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Forgets the previous step's results."""
        self.var_grads: Optional[list] = None
        self.outputs: dict[int, list] = {}
        self.objectives: dict[int, tf.Tensor] = {}
        self._stash: dict[int, tuple] = {}
        self.stats = ScheduleStats()

    def _recv(self, dtypes, peer, tag, shapes=None) -> list:
        start = time.perf_counter()
        values = recv(dtypes, peer, tag, shapes=shapes)
        self.stats.waiting_seconds += time.perf_counter() - start
        return values

    def forward(self, microbatch: int, x: Optional[list], y: Any, sample_weight: Any, loss_factor: float,
                added_loss_factor: float, training: bool) -> None:
        """Forward of one microbatch: receive (or take ``x``), compute, send on (or keep the outputs).

        ``loss_factor`` weighs this microbatch's loss in the replica's objective and
        ``added_loss_factor`` the losses its layers add (see ``PipelineModel._loss_factors``
        and ``PipelineModel._sample_shares``).
        """
        inputs = list(x) if self.is_first else self._recv(self.in_dtypes, self.prev_rank, TAG_ACTIVATIONS, self.in_shapes)
        factors = (tf.constant(loss_factor, tf.float32), tf.constant(added_loss_factor, tf.float32))
        if training and not self.recompute:
            tape = tf.GradientTape()
            with tape:
                for k in self.float_in:
                    tape.watch(inputs[k])
                outputs, objective = self._forward_fn(inputs, y, sample_weight, *factors, True)
            self._stash[microbatch] = (tape, inputs, outputs, objective, y, sample_weight, factors)
            self.stats.hold(_nbytes(inputs + list(outputs)))
        else:
            outputs, objective = self._forward_fn(inputs, y, sample_weight, *factors, training)
            if training:
                self._stash[microbatch] = (None, inputs, None, None, y, sample_weight, factors)
                self.stats.hold(_nbytes(inputs))
        outputs = list(outputs)
        self.objectives[microbatch] = objective
        if self.is_last:
            self.outputs[microbatch] = outputs
        else:
            send(outputs, self.next_rank, TAG_ACTIVATIONS)

    def backward(self, microbatch: int, loss_scale: tf.Tensor) -> None:
        """Backward of one microbatch: gradients of ``loss_scale ×`` the objective and of the received output gradients."""
        tape, inputs, outputs, objective, y, sample_weight, factors = self._stash.pop(microbatch)
        dy = []
        if not self.is_last and self.float_out:
            dy = self._recv([self.out_dtypes[k] for k in self.float_out], self.next_rank, TAG_GRADIENTS)
        if tape is None:
            grads = self._recompute_fn(inputs, y, sample_weight, *factors, dy, loss_scale)
            self.stats.release(_nbytes(inputs))
        else:
            grads = self._gradients(tape, inputs, outputs, objective, dy, loss_scale)
            self.stats.release(_nbytes(inputs + list(outputs)))
        grads = [tf.convert_to_tensor(g) for g in grads]
        in_grads, var_grads = grads[:len(self.float_in)], grads[len(self.float_in):]
        if not self.is_first and in_grads:
            send(in_grads, self.prev_rank, TAG_GRADIENTS)
        self.var_grads = var_grads if self.var_grads is None else [a + g for a, g in zip(self.var_grads, var_grads)]
