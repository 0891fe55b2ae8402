"""One rank's pipeline stage: its whole schedule of microbatch forwards and backwards as one compiled step."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Sequence

import tensorflow as tf

from smdist_tf.pipeline.graph import LayerCall, ModelGraph
from smdist_tf.pipeline.offload import from_host, to_host
from smdist_tf.pipeline.point_to_point import recv, send
from smdist_tf.pipeline.schedule import Action
from smdist_tf.pipeline.topology import PipelineTopology

# Activations flow down the pipeline on one tag, their gradients up on another;
# per (peer, tag) messages arrive in send order, which every schedule keeps.
TAG_ACTIVATIONS = 1
TAG_GRADIENTS = 2
TAG_CHECKPOINT = 7  # save_weights: each variable from its first holder to rank 0


@dataclasses.dataclass
class ScheduleStats:
    """What the last step of the schedule cost this stage (for benchmarks)."""

    seconds: float = 0.0  # the whole compiled step
    waiting_seconds: float = 0.0  # blocked in receives: the bubble as this stage sees it
    peak_held: int = 0  # most microbatches of activations held at once
    peak_held_bytes: int = 0  # bytes of boundary tensors (inputs + outputs) held at the peak


class StepResult(NamedTuple):
    """What one step of the schedule leaves on this stage."""

    gradients: Optional[list]  # the stage variables' gradients, synchronised (training only)
    objective: tf.Tensor  # this stage's share of the replica's objective, regularization included
    outputs: list  # last stage: the model outputs of every microbatch, in order; others: []


def _nbytes(tensors: Sequence[tf.Tensor]) -> int:
    # Boundary tensors inside a step have static shapes (the microbatch bounds are part of the trace).
    return sum(t.shape.num_elements() * t.dtype.size for t in tensors)


class StageRunner:
    """Runs this rank's layer calls for every microbatch of a step and talks to the neighbouring stages.

    A step is one ``tf.function``, traced once per schedule and microbatch bounds: the
    schedule's actions run in order, each held back by control dependencies until the
    previous one is done, so the 1F1B memory bound holds and no Python runs between
    microbatches. A forward runs under its own ``GradientTape``, kept until the
    microbatch's backward; with ``recompute`` only the stage inputs are kept and the
    forward runs again inside the backward, and with ``offload`` too those inputs wait in
    host memory, fetched back one action before their backward. Sends return once
    queued; receives are asynchronous kernels that wait for the neighbour without
    holding a thread.
    """

    def __init__(self, graph: ModelGraph, calls: list[LayerCall], in_ids: list[int], out_ids: list[int],
                 stage: int, topology: PipelineTopology, variables: list, sync: Callable[[list], list],
                 recompute: bool = False, offload: bool = False):
        """Args (besides the stage's place in the model and the topology):
            variables: the stage's trainable variables.
            sync: makes the stage's summed gradients the replicas' (traced into the step, so
                its collectives start as soon as the last backward is done).
            recompute: keep only stage inputs between a forward and its backward.
            offload: with ``recompute``, keep those inputs in host memory meanwhile.
        """
        self.graph, self.calls, self.in_ids, self.out_ids = graph, calls, in_ids, out_ids
        self.stage, self.num_stages = stage, topology.pp_size
        self.is_first, self.is_last = stage == 0, stage == topology.pp_size - 1
        self.prev_rank = topology.stage_rank(stage - 1) if not self.is_first else None
        self.next_rank = topology.stage_rank(stage + 1) if not self.is_last else None
        self.variables, self.sync = variables, sync
        self.recompute = recompute
        self.offload = offload and recompute
        self.in_dtypes = [tf.as_dtype(graph.tensors[t].dtype) for t in in_ids]
        self.in_shapes = [tf.TensorShape(graph.tensors[t].shape) for t in in_ids]
        self.out_dtypes = [tf.as_dtype(graph.tensors[t].dtype) for t in out_ids]
        # Gradients flow only through floating-point boundary tensors, and never into the
        # model's inputs: the first stage would compute them only to drop them.
        self.float_in = [] if self.is_first else [k for k, d in enumerate(self.in_dtypes) if d.is_floating]
        self.float_out = [k for k, d in enumerate(self.out_dtypes) if d.is_floating]
        self.loss_fn: Optional[Callable[..., tf.Tensor]] = None
        # Weight regularizers this stage counts (a tied layer's only in its first stage,
        # so the sum over stages counts each once, as the unpartitioned model.losses does).
        self.regularized: list = []
        # Plain Python control flow: the schedule unrolls at trace time.
        self._step_fn = tf.function(self._step, autograph=False)
        self.stats = ScheduleStats()

    # -- the pieces of a step (traced into it) ---------------------------------------------------

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
        return list(outputs), objective

    def _gradients(self, tape: tf.GradientTape, inputs: list, outputs: list, objective: tf.Tensor, dy: list,
                   loss_scale: tf.Tensor) -> list:
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

    def _taped_forward(self, inputs: list, y: Any, sample_weight: Any, factors: tuple) -> tuple:
        with tf.GradientTape() as tape:
            for k in self.float_in:
                tape.watch(inputs[k])
            outputs, objective = self._forward(inputs, y, sample_weight, *factors, True)
        return tape, outputs, objective

    def _regularization(self, loss_scale: tf.Tensor, training: bool) -> tuple[tf.Tensor, list]:
        """Sum of this stage's weight-regularization losses, and (training) its scaled gradients."""
        if not self.regularized:
            return tf.zeros([], tf.float32), []
        with tf.GradientTape() as tape:
            total = tf.add_n([tf.cast(v.regularizer(v), tf.float32) for v in self.regularized])
        if not training:
            return total, []
        grads = tape.gradient(total, list(self.variables), output_gradients=loss_scale)
        return total, [tf.zeros(v.shape, tf.as_dtype(v.dtype)) if g is None else g for v, g in zip(self.variables, grads)]

    def _recv(self, dtypes: list, peer: int, tag: int, shapes: Optional[list], after: list) -> tuple[list, tf.Tensor]:
        """Receives once ``after`` is done; returns the tensors and the seconds spent waiting.

        The tensors are released only after the second clock read: otherwise the executor
        may run the compute they unblock first, and the wait would count it.
        """
        with tf.control_dependencies(after):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            values = recv(dtypes, peer, tag, shapes=shapes)
        with tf.control_dependencies(values):
            waited = tf.timestamp() - start
        with tf.control_dependencies([waited]):
            return [tf.identity(v) for v in values], waited

    # -- one step --------------------------------------------------------------------------------

    def run(self, actions: Sequence[Action], bounds: Sequence[tuple[int, int]], x: Optional[list], y: Optional[list],
            y_is_list: bool, sample_weight: Optional[tf.Tensor], loss_factors: Sequence[float],
            added_loss_factors: Sequence[float], training: bool, loss_scale: tf.Tensor) -> StepResult:
        """Runs one step of the schedule.

        Args:
            actions: this stage's forwards and backwards, in order (forwards only unless ``training``).
            bounds: ``(begin, end)`` rows of each microbatch in the batch.
            x: the batch's inputs (first stage; ``None`` elsewhere).
            y: the batch's targets as a list (last stage; ``None`` elsewhere or without targets).
            y_is_list: the loss takes the targets as a list (several outputs), not one tensor.
            sample_weight: one weight per sample (last stage), or ``None``.
            loss_factors: each microbatch's weight of its loss (``PipelineModel._loss_factors``).
            added_loss_factors: each microbatch's weight of its layers' added losses.
            training: run backwards and return gradients.
            loss_scale: what the optimizer multiplies the loss by (mixed precision).
        """
        factors = tf.constant([list(loss_factors), list(added_loss_factors)], tf.float32)
        start = tf.timestamp()
        gradients, objective, outputs, waited, peaks = self._step_fn(
            tuple(actions), tuple(bounds), x, y, y_is_list, sample_weight, factors, training, loss_scale)
        self.stats = ScheduleStats(seconds=float(tf.timestamp() - start), waiting_seconds=float(waited),
                                   peak_held=int(peaks[0]), peak_held_bytes=int(peaks[1]))
        return StepResult(gradients if training else None, objective, outputs)

    def _step(self, actions: tuple, bounds: tuple, x: Optional[list], y: Optional[list], y_is_list: bool,
              sample_weight: Optional[tf.Tensor], factors: tf.Tensor, training: bool, loss_scale: tf.Tensor):
        keep_tape = training and not self.recompute
        offload = training and self.offload
        stash: dict[int, tuple] = {}
        # Offloaded microbatches: their stage inputs in host memory and their devices, until
        # the action before their backward fetches them back.
        on_host: dict[int, tuple[list, list]] = {}
        fetched: dict[int, list] = {}
        objectives: dict[int, tf.Tensor] = {}
        outputs_of: dict[int, list] = {}
        var_grads: Optional[list] = None
        waited = tf.zeros([], tf.float64)
        held = held_bytes = peak_held = peak_bytes = 0
        done: list = []  # what the next action waits for: the schedule's order, kept in the graph
        for position, (kind, i) in enumerate(actions):
            upcoming = actions[position + 1] if position + 1 < len(actions) else None
            if upcoming is not None and upcoming[0] == "B" and upcoming[1] in on_host:
                # Ahead of need: the copy back overlaps this action (and the receive of the
                # upcoming backward's gradients).
                fetched[upcoming[1]] = from_host(*on_host.pop(upcoming[1]), after=done)
            begin, end = bounds[i]
            mb_factors = (factors[0, i], factors[1, i])
            if kind == "F":
                if self.is_first:
                    with tf.control_dependencies(done):
                        inputs = [t[begin:end] for t in x]
                else:
                    shapes = [tf.TensorShape([end - begin]).concatenate(s[1:]) for s in self.in_shapes]
                    inputs, wait = self._recv(self.in_dtypes, self.prev_rank, TAG_ACTIVATIONS, shapes, done)
                    waited += wait
                y_mb = w_mb = None
                if self.is_last and y is not None:
                    y_mb = [t[begin:end] for t in y]
                    y_mb = y_mb if y_is_list else y_mb[0]
                    w_mb = None if sample_weight is None else sample_weight[begin:end]
                with tf.control_dependencies(inputs):
                    if keep_tape:
                        tape, outputs, objective = self._taped_forward(inputs, y_mb, w_mb, mb_factors)
                    else:
                        tape = None
                        outputs, objective = self._forward(inputs, y_mb, w_mb, *mb_factors, training)
                if training:
                    if offload and upcoming != ("B", i):
                        # A backward right after its forward would fetch at once: nothing to gain.
                        on_host[i] = (to_host(inputs), [t.device for t in inputs])
                    stash[i] = (tape, inputs, outputs, objective, y_mb, w_mb, mb_factors)
                    size = _nbytes(inputs + outputs) if keep_tape else _nbytes(inputs)
                    held, held_bytes = held + 1, held_bytes + size
                    peak_held, peak_bytes = max(peak_held, held), max(peak_bytes, held_bytes)
                objectives[i] = objective
                done = outputs + [objective]
                if self.is_last:
                    outputs_of[i] = outputs
                else:
                    done.append(send(outputs, self.next_rank, TAG_ACTIVATIONS))
            else:
                tape, inputs, outputs, objective, y_mb, w_mb, mb_factors = stash.pop(i)
                dy = []
                if not self.is_last and self.float_out:
                    dy, wait = self._recv([self.out_dtypes[k] for k in self.float_out], self.next_rank,
                                          TAG_GRADIENTS, None, done)
                    waited += wait
                with tf.control_dependencies(done + dy):
                    # An offloaded microbatch was fetched during the action before this one.
                    inputs = fetched.pop(i, inputs)
                    if tape is None:
                        # Identity under the control dependency: the recomputed forward is a
                        # new computation that graph optimisers cannot merge with the first.
                        inputs = [tf.identity(t) for t in inputs]
                        tape, outputs, objective = self._taped_forward(inputs, y_mb, w_mb, mb_factors)
                        size = _nbytes(inputs)
                    else:
                        size = _nbytes(inputs + outputs)
                    grads = self._gradients(tape, inputs, outputs, objective, dy, loss_scale)
                held, held_bytes = held - 1, held_bytes - size
                in_grads, mb_grads = grads[:len(self.float_in)], grads[len(self.float_in):]
                var_grads = mb_grads if var_grads is None else [a + g for a, g in zip(var_grads, mb_grads)]
                done = list(grads)
                if not self.is_first and in_grads:
                    done.append(send(in_grads, self.prev_rank, TAG_GRADIENTS))
        regularization, reg_grads = self._regularization(loss_scale, training)
        gradients: list = []
        if training:
            gradients = var_grads if var_grads is not None else [tf.zeros(v.shape, tf.as_dtype(v.dtype))
                                                                 for v in self.variables]
            if reg_grads:
                gradients = [g + r for g, r in zip(gradients, reg_grads)]
            gradients = self.sync(gradients)
        objective = tf.add_n([objectives[i] for i in sorted(objectives)] + [regularization])
        outputs = [outputs_of[i] for i in sorted(outputs_of)]
        return gradients, objective, outputs, waited, tf.constant([peak_held, peak_bytes], tf.int64)
