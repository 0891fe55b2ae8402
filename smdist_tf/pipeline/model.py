"""``PipelineModel``: a Keras model split into pipeline stages across ranks, combinable with data parallelism."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Optional, Union

import keras
import numpy as np
import tensorflow as tf

from smdist_tf.collectives import allgather, allreduce, grouped_allreduce
from smdist_tf.pipeline import checkpoint, partition as partition_lib
from smdist_tf.pipeline import schedule as schedule_lib
from smdist_tf.pipeline import topology as topology_lib
from smdist_tf.pipeline import weights as weights_lib
from smdist_tf.keras_api import require_keras_3
from smdist_tf.reduce_ops import Min, Sum
from smdist_tf.runtime import rank, size
from smdist_tf.pipeline.exchange import GroupPlan
from smdist_tf.pipeline.gradient_sync import GradientSync
from smdist_tf.pipeline.graph import ModelGraph
from smdist_tf.pipeline.stage import StageRunner

_MOVABLE = (tf.bool, tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64)
_REDUCIBLE = _MOVABLE[1:]
# Loss reductions a microbatched step reproduces exactly (see PipelineModel._loss_factors).
_REDUCTIONS = ("sum_over_batch_size", "mean", "sum", "mean_with_sample_weight")

ModelOrBuilder = Union[keras.Model, Callable[[], keras.Model]]


def even_split(total: int, parts: int) -> list[int]:
    """Sizes of ``parts`` consecutive pieces of ``total`` items, differing by at most one, the larger first.

    With ``total < parts`` the last pieces are empty. Sizes depend on ``total`` and
    ``parts`` alone, so every rank derives the same split from the batch size.
    """
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def _as_list(x: Any) -> list:
    if isinstance(x, dict):
        raise ValueError("PipelineModel takes model inputs as a tensor or a list, not a dict")
    return list(x) if isinstance(x, (list, tuple)) else [x]


class _FunctionLoss(keras.losses.Loss):
    """A per-sample loss function as a Keras ``Loss`` (mean over the batch, sample weights applied), as ``compile`` does."""

    def __init__(self, fn: Callable):
        super().__init__(name=getattr(fn, "__name__", "loss"), reduction="sum_over_batch_size")
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)


class PipelineModel(keras.Model):
    """Runs a Keras model as a pipeline of ``num_stages`` stages, each replicated ``size() / num_stages`` times.

    Rank ``r`` runs stage ``r % num_stages`` of pipeline ``r // num_stages`` and holds
    only the weights its stage uses. Each global batch is split over the data-parallel
    replicas and then into ``num_microbatches`` microbatches that flow through the stages
    under the chosen schedule. Loss and gradients equal the unpartitioned model's on the
    global batch (sample weights, regularization losses and loss scaling included); the
    loss, metrics and predictions every rank sees are the global values.

    Args:
        model: a function that builds the model (recommended: it is called on every rank
            and only this rank's stage gets weight values, so no rank ever holds the whole
            model), or a built model (every rank then holds the whole model until it is
            wrapped; the weights of other stages are released here). A Sequential (starting
            with ``keras.Input``) or functional model. Skip connections may cross stages; a
            layer called in several stages (tied weights) is held by each of them, its
            gradients summed over them.
        num_stages: pipeline stages; the world size must be a multiple of it.
        num_microbatches: microbatches per replica batch. A batch that does not divide
            is split into nearly equal parts (sizes differ by at most one); a replica
            with fewer samples than ``num_microbatches`` runs one microbatch per sample.
        schedule: ``'1f1b'`` (at most ``num_stages − stage`` microbatches of activations held)
            or ``'gpipe'`` (all forwards, then all backwards).
        partition: ``'auto'`` (balance trainable parameters), ``'uniform'`` (balance the
            number of layer calls), a list of stage sizes, or a list of layer names where
            stages begin.
        recompute: hold only stage inputs and recompute the forward during the backward.
        offload_activations: with ``recompute``, hold those stage inputs in host memory
            (``/CPU:0``) between a microbatch's forward and its backward, fetched back
            one action ahead of the backward (docs/pipeline-parallelism.md#activation-offloading).
        verbose: print the stage summary on rank 0.
        progress_on_rank_zero_only: route Keras' progress bars and messages of
            ``fit``/``evaluate``/``predict`` on the other ranks to absl logging (hidden by
            default), so one rank prints them, as ``DataParallelStrategy`` does.
        name: model name.

    Raises:
        ValueError: bad stage count, partition, schedule or microbatch count, or
            ``offload_activations`` without ``recompute`` (on every rank).
        TypeError: ``model`` is neither a Keras model nor a function returning one.
    """

    def __init__(self, model: ModelOrBuilder, num_stages: int, num_microbatches: int, schedule: str = "1f1b",
                 partition: partition_lib.PartitionSpec = "auto", recompute: bool = False,
                 offload_activations: bool = False, verbose: bool = True, progress_on_rank_zero_only: bool = True,
                 name: Optional[str] = None):
        require_keras_3("PipelineModel")
        if not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ValueError(f"num_microbatches must be a positive int, got {num_microbatches!r}")
        if schedule not in schedule_lib.SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(schedule_lib.SCHEDULES)}")
        if offload_activations and not recompute:
            # TensorFlow keeps an op's saved tensors where the op ran: only a recomputed
            # block's inputs can wait elsewhere.
            raise ValueError("offload_activations=True offloads the stage inputs that recompute=True keeps: pass "
                             "recompute=True too (or wrap layers in smdist_tf.keras.OffloadActivations)")
        topology = topology_lib.PipelineTopology(rank(), size(), int(num_stages))
        scope = None
        if isinstance(model, keras.Model):
            built = model
        elif callable(model):
            # Declared, not allocated: only this stage's variables get values below.
            built, scope = weights_lib.build_deferred(model)
        else:
            raise TypeError(f"PipelineModel takes a keras.Model or a function building one, got {type(model).__name__}")
        model = built
        graph = ModelGraph(model)
        calls = graph.calls
        names = [c.layer.name for c in calls]
        params = [sum(int(np.prod(v.shape)) for v in c.layer.trainable_variables) for c in calls]
        sizes = partition_lib.resolve(partition, names, params, int(num_stages))

        super().__init__(name=name or f"pipeline_{model.name}")
        self.topology = topology
        topology_lib.set_current(self.topology)
        self.unpartitioned = model
        self.num_stages, self.num_microbatches, self.schedule = int(num_stages), num_microbatches, schedule
        self._graph = graph
        self.stage_bounds = [(sum(sizes[:s]), sum(sizes[:s + 1])) for s in range(self.num_stages)]

        # Which stages use each variable (tied weights are used by several); a variable
        # no layer call owns stays with stage 0.
        stage_of_layer: dict[int, list[int]] = {}
        for s, (a, b) in enumerate(self.stage_bounds):
            for c in calls[a:b]:
                stages = stage_of_layer.setdefault(id(c.layer), [])
                if s not in stages:
                    stages.append(s)
        self._variable_stages: dict[int, list[int]] = {}
        for c in calls:
            for v in c.layer.variables:
                self._variable_stages.setdefault(id(v), stage_of_layer[id(c.layer)])
        for v in model.variables:
            self._variable_stages.setdefault(id(v), [0])

        s = self.topology.pp_rank
        a, b = self.stage_bounds[s]
        in_ids = graph.input_ids if s == 0 else graph.live_after(a)
        out_ids = graph.output_ids if s == self.num_stages - 1 else graph.live_after(b)
        self._stage_layer_ids = {id(c.layer) for c in calls[a:b]}
        self._materialize(scope)

        stage_ids = {id(w) for c in calls[a:b] for w in c.layer.trainable_variables}
        stage_vars = [v for v in model.trainable_variables if id(v) in stage_ids]
        position = {id(v): k for k, v in enumerate(stage_vars)}
        trainable = model.trainable_variables
        self._runner = StageRunner(graph, calls[a:b], in_ids, out_ids, s, self.topology, stage_vars,
                                   GradientSync(self._plan(trainable, [position.get(id(v)) for v in trainable]),
                                                self.topology.dp_size), recompute, offload_activations)
        # A tied variable's regularizer counts once, in the first stage using it.
        self._runner.regularized = [v for v in stage_vars if getattr(v, "regularizer", None) is not None
                                    and min(self._variable_stages[id(v)]) == s]
        self._verify_batch = True
        self._quiet_progress = progress_on_rank_zero_only and rank() != 0
        self.built = True
        if verbose and rank() == 0:
            print(self.stage_summary(), flush=True)

    # -- which weights this rank holds -------------------------------------------------------------

    def _holders(self, variable: Any) -> tuple:
        """Ranks holding ``variable``: every replica of every stage using it, ascending."""
        topo = self.topology
        return tuple(sorted(dp * topo.pp_size + st for dp in range(topo.dp_size)
                            for st in self._variable_stages[id(variable)]))

    def _plan(self, variables: list, local: list) -> GroupPlan:
        return GroupPlan([self._holders(v) for v in variables], local)

    def _materialize(self, scope: Optional[keras.StatelessScope]) -> None:
        """Gives this stage's variables values (same on all their holders) and no others."""
        model, s = self.unpartitioned, self.topology.pp_rank
        variables = model.variables
        mine = [s in self._variable_stages[id(v)] for v in variables]
        if scope is not None:
            weights_lib.claim_deferred(variables)
        elif getattr(model, "_smdist_released", False):
            # Checked on a mark every rank set, so every rank raises (a per-variable check would not).
            raise ValueError("this model was already wrapped in a PipelineModel, which released other stages' "
                             "weights on each rank; wrap a freshly built model (or pass a function building it)")
        elif self.num_stages > 1:
            model._smdist_released = True
        for v, held in zip(variables, mine):
            if held:
                if scope is not None:
                    weights_lib.materialize(v, scope)
            else:
                # Deferred variables just get the guard; values a built model (or a function
                # returning one) already has are dropped.
                weights_lib.release(v, weights_lib.NotHeld(v.path, self._variable_stages[id(v)], rank()))
        # Replicas and tied copies start from their first holder's values.
        held = [v for v, h in zip(variables, mine) if h]
        index = {id(v): k for k, v in enumerate(held)}
        plan = self._plan(variables, [index.get(id(v)) for v in variables])
        if plan.needed:
            values = [tf.convert_to_tensor(v) for v in held]
            for v, old, new in zip(held, values, plan.broadcast(values, name="pipeline.initial_weights")):
                if new is not old:
                    v.assign(new)

    @property
    def held_variables(self) -> list:
        """The unpartitioned model's variables this rank holds values for (its stage's, tied ones included)."""
        return [v for v in self.unpartitioned.variables if weights_lib.is_held(v)]

    # -- topology --------------------------------------------------------------------------------

    def pp_rank(self) -> int:
        """This rank's stage."""
        return self.topology.pp_rank

    def pp_size(self) -> int:
        """Number of stages."""
        return self.topology.pp_size

    def dp_rank(self) -> int:
        """This rank's index among its stage's replicas."""
        return self.topology.dp_rank

    def dp_size(self) -> int:
        """Replicas of each stage."""
        return self.topology.dp_size

    @property
    def stage_variables(self) -> list:
        """Trainable variables of this rank's stage."""
        return list(self._runner.variables)

    def stage_summary(self) -> str:
        """Layers, trainable parameters and outgoing activation shapes of every stage."""
        lines = [f"PipelineModel '{self.unpartitioned.name}': {self.num_stages} stages x {self.topology.dp_size} "
                 f"data-parallel, {self.num_microbatches} microbatches, schedule {self.schedule}"]
        for s, (a, b) in enumerate(self.stage_bounds):
            layers = []
            for c in self._graph.calls[a:b]:
                if c.layer not in layers:
                    layers.append(c.layer)
            params = sum(int(np.prod(v.shape)) for layer in layers for v in layer.trainable_variables)
            out_ids = self._graph.output_ids if s == self.num_stages - 1 else self._graph.live_after(b)
            shapes = ", ".join(str(tuple(self._graph.tensors[t].shape)) for t in out_ids)
            names = ", ".join(layer.name for layer in layers)
            lines.append(f"  stage {s}: {b - a} layer calls [{names}]  params {params:,}  sends {shapes}")
        return "\n".join(lines)

    # -- Keras hooks -----------------------------------------------------------------------------

    def call(self, inputs, training=None):
        # Keras traces this symbolically to learn output shapes; real steps run the pipeline.
        if tf.executing_eagerly():
            raise RuntimeError("a PipelineModel is split over ranks: run it with fit/evaluate/predict "
                               "(or pipeline_gradients), not by calling it")
        return self.unpartitioned(inputs, training=training)

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, **kwargs) -> None:
        """As ``keras.Model.compile``; Keras' step runs eagerly around the pipeline's compiled step.

        Raises:
            ValueError: a loss whose reduction a microbatched step cannot reproduce
                (``reduction=None``/``'none'``).
        """
        kwargs.pop("run_eagerly", None)
        kwargs.pop("jit_compile", None)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, run_eagerly=True, jit_compile=False, **kwargs)
        if loss is None:
            self._runner.loss_fn = None
        else:
            fn = loss if isinstance(loss, keras.losses.Loss) else keras.losses.get(loss)
            if fn is None:
                raise ValueError(f"unknown loss {loss!r}")
            if not isinstance(fn, keras.losses.Loss):
                fn = _FunctionLoss(fn)  # a per-sample function: reduce like Keras' default (mean over the batch)
            if fn.reduction not in _REDUCTIONS:
                raise ValueError(f"PipelineModel needs a loss that reduces to a scalar ({', '.join(_REDUCTIONS)}); "
                                 f"{fn.name} has reduction={fn.reduction!r}")
            self._runner.loss_fn = fn
        if not self.optimizer.built:
            self.optimizer.build(self._runner.variables)

    def fit(self, *args, **kwargs):
        self._verify_batch = True
        with self._progress_output():
            return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        self._verify_batch = True
        with self._progress_output():
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._verify_batch = True
        with self._progress_output():
            return super().predict(*args, **kwargs)

    @contextlib.contextmanager
    def _progress_output(self) -> Iterator[None]:
        """Keras' progress bars go to absl logging (hidden) on ranks other than 0 while a call runs."""
        if not self._quiet_progress or not keras.config.is_interactive_logging_enabled():
            yield
            return
        keras.config.disable_interactive_logging()
        try:
            yield
        finally:
            keras.config.enable_interactive_logging()

    def save(self, filepath: Union[str, os.PathLike], *args: Any, **kwargs: Any) -> None:
        """Not supported: a whole-model ``.keras`` file needs every stage's weights on one rank.

        Raises:
            NotImplementedError: always; the message names the alternatives.
        """
        raise NotImplementedError(
            f"PipelineModel.save({os.fspath(filepath)!r}) is not supported: the model is split over ranks. "
            "Save its weights with pipe.save_weights('model.weights.h5') (collective; any stage count or the "
            "plain Keras model loads them), or, if the whole model fits in one process, call "
            "pipe.gather_weights() on every rank and then pipe.unpartitioned.save(...) on one.")

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        scale = self._loss_scale()
        loss, y_pred, grads = self._step(x, y, sample_weight, training=True, loss_scale=scale)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            grads = self._agree_finite(grads)
        self.optimizer.apply(grads, self._runner.variables)
        return self._logs(x, y, loss, y_pred, sample_weight)

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred, _ = self._step(x, y, sample_weight, training=False)
        return self._logs(x, y, loss, y_pred, sample_weight)

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        _, y_pred, _ = self._step(x, None, None, training=False)
        return y_pred

    def _logs(self, x, y, loss, y_pred, sample_weight) -> dict:
        batch = int(tf.shape(_as_list(x)[0])[0])
        self._loss_tracker.update_state(loss, sample_weight=batch)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _loss_scale(self) -> tf.Tensor:
        """What the optimizer multiplies the loss by before differentiating (LossScaleOptimizer, ``loss_scale_factor``)."""
        if self.optimizer is None:
            return tf.constant(1.0, tf.float32)
        return tf.cast(self.optimizer.scale_loss(tf.constant(1.0, tf.float32)), tf.float32)

    def _agree_finite(self, grads: list) -> list:
        """Every rank's LossScaleOptimizer must skip a step together.

        Each rank holds other gradients, so its optimizer's own finiteness check can
        differ; a skip on some ranks only would split the weights and the loss scales.
        One world allreduce-MIN decides; a rank that must skip feeds its optimizer
        non-finite gradients, which make it take its skip branch (halving the scale).
        """
        local = all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)
        agreed = allreduce(tf.constant(int(local), tf.int32), op=Min, name="pipeline.grads_finite")
        if int(agreed):
            return grads
        return [tf.fill(tf.shape(g), tf.constant(float("nan"), g.dtype)) for g in grads]

    # -- the pipeline step -----------------------------------------------------------------------

    def pipeline_gradients(self, x, y, sample_weight=None) -> tuple[tf.Tensor, list]:
        """Runs one training schedule without applying it.

        The optimizer's loss scale (mixed precision) is applied during the step, as in
        ``fit``, and divided out of the returned gradients.

        Returns:
            ``(global loss, [(variable, gradient), ...])`` for this rank's stage variables,
            after data-parallel averaging and tied-weight summation.
        """
        scale = self._loss_scale()
        loss, _, grads = self._step(x, y, sample_weight, training=True, loss_scale=scale)
        return loss, [(v, g / tf.cast(scale, g.dtype)) for v, g in zip(self._runner.variables, grads)]

    def _check_batch(self, x: list, y: Any, sample_weight: Any, batch: int) -> None:
        """Every rank must hold the same global batch: data goes to the first stage, labels to the last."""
        if not self._verify_batch:
            return
        self._verify_batch = False
        tensors = x + ([] if y is None else _as_list(y)) + ([] if sample_weight is None else [sample_weight])
        parts = [tf.reduce_sum(tf.cast(t, tf.float64)) for t in tensors]
        checksum = tf.stack([tf.constant(float(batch), tf.float64)] + parts)
        everyone = allgather(checksum[None], name="pipeline.batch_check").numpy()
        if not np.allclose(everyone, everyone[0:1], rtol=1e-9, atol=0.0):
            raise ValueError("ranks were given different batches: every rank must feed PipelineModel the same "
                             "data in the same order (same dataset, same shuffle seed)")

    def _microbatches(self, batch: int) -> list[tuple[int, int]]:
        """``(begin, end)`` in the global batch of each of this replica's microbatches.

        The batch is split over the replicas, and each replica's shard into at most
        ``num_microbatches`` microbatches, sizes differing by at most one at both levels
        (:func:`even_split`): every stage waits for the largest microbatch, and no
        microbatch is empty, so a shard smaller than ``num_microbatches`` runs one
        microbatch per sample (a replica without samples runs none). The stages of a
        pipeline see the same batch size, so they agree on every microbatch's shape.
        """
        shards = even_split(batch, self.topology.dp_size)
        begin = sum(shards[:self.topology.dp_rank])
        bounds = []
        for rows in even_split(shards[self.topology.dp_rank], self.num_microbatches):
            if rows:
                bounds.append((begin, begin + rows))
                begin += rows
        return bounds

    def _loss_factors(self, sample_weight: Optional[tf.Tensor], batch: int,
                      microbatches: list[tuple[int, int]]) -> list[float]:
        """Weight of each microbatch's loss in this replica's objective.

        The replica objectives are averaged over the ``d`` replicas (as the gradients
        are), so microbatch ``k``'s loss ``L_k`` gets the weight that makes
        ``(1/d) Σ_replicas Σ_k w_k L_k`` the loss of the whole global batch of ``B``
        samples: ``d · b_k / B`` for a mean over the batch (``b_k``: the microbatch's
        samples; ``1/m`` when the batch divides), ``d`` for a sum, and ``d · W_k / W``
        for ``mean_with_sample_weight`` (``W_k``: the sample weights of microbatch ``k``,
        ``W``: of the global batch).
        """
        d = self.topology.dp_size
        reduction = getattr(self._runner.loss_fn, "reduction", "sum_over_batch_size")
        if reduction == "sum":
            return [float(d)] * len(microbatches)
        if reduction == "mean_with_sample_weight" and sample_weight is not None:
            w = tf.cast(sample_weight, tf.float64)
            total = float(tf.reduce_sum(w))
            parts = [float(tf.reduce_sum(w[begin:end])) for begin, end in microbatches]
            return [d * p / total if total else 0.0 for p in parts]
        return self._sample_shares(batch, microbatches)

    def _sample_shares(self, batch: int, microbatches: list[tuple[int, int]]) -> list[float]:
        """``d · b_k / B``: the weight that turns microbatch means into the global batch's mean."""
        d = self.topology.dp_size
        return [d * (end - begin) / batch for begin, end in microbatches]

    def _step(self, x, y, sample_weight, training: bool, loss_scale: Optional[tf.Tensor] = None):
        x = [tf.convert_to_tensor(t) for t in _as_list(x)]
        if sample_weight is not None:
            if isinstance(sample_weight, (list, tuple, dict)):
                raise ValueError("PipelineModel takes sample weights as one tensor (one weight per sample)")
            sample_weight = tf.convert_to_tensor(sample_weight)
        batch = int(tf.shape(x[0])[0])
        self._check_batch(x, y, sample_weight, batch)
        runner = self._runner
        if runner.is_last and y is not None and runner.loss_fn is None:
            raise ValueError("compile the PipelineModel with a loss before fit/evaluate")
        scale = tf.constant(1.0, tf.float32) if loss_scale is None else loss_scale
        microbatches = self._microbatches(batch)
        m = len(microbatches)

        ys = None if y is None else [tf.convert_to_tensor(t) for t in _as_list(y)]
        loss_factors = self._loss_factors(sample_weight, batch, microbatches)
        # Losses the layers add (activity regularizers) are means over their microbatch.
        added_loss_factors = self._sample_shares(batch, microbatches)
        if training:
            actions = schedule_lib.build(self.schedule, runner.stage, self.num_stages, m)
        else:
            actions = [schedule_lib.Action("F", i) for i in range(m)]
        result = runner.run(actions, microbatches, x if runner.is_first else None, ys if runner.is_last else None,
                            isinstance(y, (list, tuple)), sample_weight if runner.is_last else None, loss_factors,
                            added_loss_factors, training, scale)
        loss, y_pred = self._share_outputs(batch, microbatches, result.objective, result.outputs)
        return loss, y_pred, result.gradients

    def _share_outputs(self, batch: int, microbatches: list[tuple[int, int]], local_loss: tf.Tensor,
                       stage_outputs: list):
        """Global loss and the whole batch's predictions on every rank (one fused world allreduce).

        Every rank adds its share of the objective (the loss on the last stage, added and
        regularization losses on any); replicas' shares are averaged. Each replica's last
        stage fills its microbatches' rows of the predictions, every other rank zeros.
        """
        runner, d = self._runner, self.topology.dp_size
        tensors = []
        for k, t in enumerate(self._graph.output_ids):
            spec = self._graph.tensors[t]
            tail = list(spec.shape[1:])
            if any(dim is None for dim in tail):
                raise ValueError(f"model output {spec.name} needs a fully defined shape after the batch dimension")
            dtype = tf.as_dtype(spec.dtype)
            if runner.is_last and microbatches:
                start, stop = microbatches[0][0], microbatches[-1][1]
                local = tf.concat([outputs[k] for outputs in stage_outputs], 0)
                full = tf.concat([tf.zeros([start] + tail, dtype), tf.cast(local, dtype),
                                  tf.zeros([batch - stop] + tail, dtype)], 0)
            else:
                full = tf.zeros([batch] + tail, dtype)
            tensors.append(tf.cast(full, tf.float32) if dtype not in _REDUCIBLE else full)
        reduced = grouped_allreduce([tf.cast(local_loss, tf.float32)] + tensors, op=Sum, name="pipeline.outputs")
        outputs = [tf.cast(r, tf.as_dtype(self._graph.tensors[t].dtype)) for r, t in zip(reduced[1:], self._graph.output_ids)]
        return reduced[0] / d, outputs[0] if len(outputs) == 1 else outputs

    # -- checkpoints (smdist_tf/pipeline/checkpoint.py) ---------------------------------------------

    def gather_weights(self) -> list[np.ndarray]:
        """Gives every rank the whole model's current weights (collective: call it on every rank).

        Every stage's variables get their current values on every rank, so afterwards
        ``pipe.unpartitioned`` (the Keras model that was split) is whole and can be
        saved or run alone. This materialises the **whole** model on every rank, undoing
        the per-stage memory saving; use it to export or inspect a model that fits.
        ``save_weights`` does not need it.

        Returns:
            The weights as NumPy arrays in ``pipe.unpartitioned.get_weights()`` order (the
            order a plain build of the same model takes in ``set_weights``), the same on
            every rank.
        """
        return checkpoint.gather_weights(self)

    def save_weights(self, filepath: Union[str, os.PathLike], overwrite: bool = True, **kwargs) -> None:
        """Saves the unpartitioned model's weights (a ``.weights.h5`` file any stage count, or plain Keras, loads).

        Collective: call it on every rank. Each variable travels from its first holder to
        rank 0, which writes it; no rank ever holds more than its own stage plus one
        variable.

        Raises:
            ValueError: a path not ending in ``.weights.h5``, or unsupported options (``max_shard_size``).
            FileExistsError: ``overwrite=False`` and the file exists.
        """
        checkpoint.save_weights(self, filepath, overwrite, **kwargs)

    def load_weights(self, filepath: Union[str, os.PathLike], skip_mismatch: bool = False, **kwargs) -> None:
        """Loads an unpartitioned ``.weights.h5`` file (saved with any stage count, or by plain Keras).

        Every rank reads the datasets of the variables it holds, nothing else. Not
        collective. Every rank checks the whole file first, so a mismatch raises on all.

        Raises:
            ValueError: the file lacks a variable or has another shape for it.
        """
        checkpoint.load_weights(self, filepath, skip_mismatch, **kwargs)

    def save_stage_weights(self, directory: Union[str, os.PathLike]) -> str:
        """Writes this stage's weights to ``directory/stage-S-of-P.npz`` (first replica of each stage). Collective."""
        return checkpoint.save_stage_weights(self, directory)

    def load_stage_weights(self, directory: Union[str, os.PathLike]) -> None:
        """Loads the file :meth:`save_stage_weights` wrote for this stage (same stage count)."""
        checkpoint.load_stage_weights(self, directory)
