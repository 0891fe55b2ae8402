"""``PipelineModel``: a Keras model split into pipeline stages across ranks, combinable with data parallelism."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf.pipeline import partition as partition_lib
from smdist_tf.pipeline import schedule as schedule_lib
from smdist_tf.pipeline import topology as topology_lib
from smdist_tf.pipeline.gradient_sync import GradientSync
from smdist_tf.pipeline.graph import ModelGraph
from smdist_tf.pipeline.stage import StageRunner

_MOVABLE = (tf.bool, tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64)
_REDUCIBLE = _MOVABLE[1:]


def _as_list(x: Any) -> list:
    if isinstance(x, dict):
        raise ValueError("PipelineModel takes model inputs as a tensor or a list, not a dict")
    return list(x) if isinstance(x, (list, tuple)) else [x]


class PipelineModel(keras.Model):
    """Runs ``model`` as a pipeline of ``num_stages`` stages, each replicated ``size() / num_stages`` times.

    Every rank builds the same unpartitioned Keras model and wraps it; rank ``r`` runs
    stage ``r % num_stages`` of pipeline ``r // num_stages``. Each global batch is split
    over the data-parallel replicas and then into ``num_microbatches`` microbatches that
    flow through the stages under the chosen schedule. Gradients equal the unpartitioned
    model's on the global batch; the loss, metrics and predictions every rank sees are
    the global values.

    Args:
        model: a Sequential (starting with ``keras.Input``) or functional Keras model. Skip
            connections may cross stages; a layer called in several stages (tied weights)
            is replicated there, its gradients summed over those stages.
        num_stages: pipeline stages; the world size must be a multiple of it.
        num_microbatches: microbatches per replica batch; the global batch must divide
            by ``num_microbatches × dp_size``.
        schedule: ``'1f1b'`` (at most ``num_stages − stage`` microbatches of activations held)
            or ``'gpipe'`` (all forwards, then all backwards).
        partition: ``'auto'`` (balance trainable parameters), ``'uniform'`` (balance the
            number of layer calls), a list of stage sizes, or a list of layer names where
            stages begin.
        recompute: hold only stage inputs and recompute the forward during the backward.
        verbose: print the stage summary on rank 0.
        name: model name.
    """

    def __init__(self, model: keras.Model, num_stages: int, num_microbatches: int, schedule: str = "1f1b",
                 partition: partition_lib.PartitionSpec = "auto", recompute: bool = False,
                 verbose: bool = True, name: Optional[str] = None):
        super().__init__(name=name or f"pipeline_{model.name}")
        if not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ValueError(f"num_microbatches must be a positive int, got {num_microbatches!r}")
        if schedule not in schedule_lib.SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(schedule_lib.SCHEDULES)}")
        self.topology = topology_lib.PipelineTopology(sd.rank(), sd.size(), int(num_stages))
        topology_lib.set_current(self.topology)
        self.unpartitioned = model
        self.num_stages, self.num_microbatches, self.schedule = int(num_stages), num_microbatches, schedule
        graph = ModelGraph(model)
        self._graph = graph
        calls = graph.calls
        names = [c.layer.name for c in calls]
        params = [sum(int(np.prod(v.shape)) for v in c.layer.trainable_variables) for c in calls]
        sizes = partition_lib.resolve(partition, names, params, self.num_stages)
        self.stage_bounds = [(sum(sizes[:s]), sum(sizes[:s + 1])) for s in range(self.num_stages)]

        # Which stages use each variable (tied weights are used by several).
        stage_of_layer: dict[int, list[int]] = {}
        for s, (a, b) in enumerate(self.stage_bounds):
            for c in calls[a:b]:
                stages = stage_of_layer.setdefault(id(c.layer), [])
                if s not in stages:
                    stages.append(s)
        self._variable_stages: dict[int, list[int]] = {}
        for c in calls:
            for v in c.layer.variables:
                self._variable_stages[id(v)] = stage_of_layer[id(c.layer)]

        s = self.topology.pp_rank
        a, b = self.stage_bounds[s]
        in_ids = graph.input_ids if s == 0 else graph.live_after(a)
        out_ids = graph.output_ids if s == self.num_stages - 1 else graph.live_after(b)
        stage_layers = {id(c.layer) for c in calls[a:b]}
        stage_vars = [v for v in model.trainable_variables if any(id(v) == id(w) for c in calls[a:b] for w in c.layer.trainable_variables)]
        self._stage_layer_ids = stage_layers
        self._runner = StageRunner(graph, calls[a:b], in_ids, out_ids, s, self.topology, stage_vars, recompute)
        users = {id(v): len(self._variable_stages.get(id(v), [s])) for v in model.trainable_variables}
        self._sync = GradientSync(model.trainable_variables, stage_vars, users, self.topology.dp_size)
        self._verify_batch = True

        # Every rank starts from rank 0's weights (tied copies included).
        sd.broadcast_variables([v for v in model.variables if tf.as_dtype(v.dtype) in _MOVABLE], root_rank=0,
                               name="pipeline.initial_weights")
        self.built = True
        if verbose and sd.rank() == 0:
            print(self.stage_summary(), flush=True)

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
        # Used only symbolically (Keras builds metrics from it); real steps run the pipeline.
        return self.unpartitioned(inputs, training=training)

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, **kwargs) -> None:
        """As ``keras.Model.compile``; the pipeline always runs its schedule eagerly around compiled stages."""
        kwargs.pop("run_eagerly", None)
        kwargs.pop("jit_compile", None)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, run_eagerly=True, jit_compile=False, **kwargs)
        if loss is None:
            self._runner.loss_fn = None
        elif isinstance(loss, keras.losses.Loss):
            self._runner.loss_fn = loss
        else:
            fn = keras.losses.get(loss)
            if fn is None:
                raise ValueError(f"unknown loss {loss!r}")
            if isinstance(fn, keras.losses.Loss):
                self._runner.loss_fn = fn
            else:  # a per-sample function: reduce like Keras' default (mean over the batch)
                self._runner.loss_fn = lambda y_true, y_pred: keras.ops.mean(fn(y_true, y_pred))
        if not self.optimizer.built:
            self.optimizer.build(self._runner.variables)

    def fit(self, *args, **kwargs):
        self._verify_batch = True
        return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        self._verify_batch = True
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._verify_batch = True
        return super().predict(*args, **kwargs)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise ValueError("PipelineModel does not support sample weights yet")
        loss, y_pred, grads = self._step(x, y, training=True)
        self.optimizer.apply(grads, self._runner.variables)
        return self._logs(x, y, loss, y_pred)

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise ValueError("PipelineModel does not support sample weights yet")
        loss, y_pred, _ = self._step(x, y, training=False)
        return self._logs(x, y, loss, y_pred)

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        _, y_pred, _ = self._step(x, None, training=False)
        return y_pred

    def _logs(self, x, y, loss, y_pred) -> dict:
        batch = int(tf.shape(_as_list(x)[0])[0])
        self._loss_tracker.update_state(loss, sample_weight=batch)
        return self.compute_metrics(x, y, y_pred, sample_weight=None)

    # -- the pipeline step -----------------------------------------------------------------------

    def pipeline_gradients(self, x, y) -> tuple[tf.Tensor, list]:
        """Runs one training schedule without applying it.

        Returns:
            ``(global loss, [(variable, gradient), ...])`` for this rank's stage variables,
            after data-parallel averaging and tied-weight summation.
        """
        loss, _, grads = self._step(x, y, training=True)
        return loss, list(zip(self._runner.variables, grads))

    def _check_batch(self, x: list, y: Any, batch: int) -> None:
        """Every rank must hold the same global batch: data goes to the first stage, labels to the last."""
        divisor = self.num_microbatches * self.topology.dp_size
        if batch % divisor != 0:
            raise ValueError(f"batch size {batch} does not divide by num_microbatches ({self.num_microbatches}) x "
                             f"data-parallel replicas ({self.topology.dp_size}) = {divisor}")
        if not self._verify_batch:
            return
        self._verify_batch = False
        parts = [tf.reduce_sum(tf.cast(t, tf.float64)) for t in x + ([] if y is None else _as_list(y))]
        checksum = tf.stack([tf.constant(float(batch), tf.float64)] + parts)
        everyone = sd.allgather(checksum[None], name="pipeline.batch_check").numpy()
        if not np.allclose(everyone, everyone[0:1], rtol=1e-9, atol=0.0):
            raise ValueError("ranks were given different batches: every rank must feed PipelineModel the same "
                             "data in the same order (same dataset, same shuffle seed)")

    def _step(self, x, y, training: bool):
        x = [tf.convert_to_tensor(t) for t in _as_list(x)]
        batch = int(tf.shape(x[0])[0])
        self._check_batch(x, y, batch)
        runner, m, topo = self._runner, self.num_microbatches, self.topology
        if runner.is_last and y is not None and runner.loss_fn is None:
            raise ValueError("compile the PipelineModel with a loss before fit/evaluate")
        shard = batch // topo.dp_size
        start = topo.dp_rank * shard
        micro = shard // m
        x_mbs = [[t[start + i * micro:start + (i + 1) * micro] for t in x] for i in range(m)]
        y_mbs = [None] * m
        if y is not None:
            ys = [tf.convert_to_tensor(t) for t in _as_list(y)]
            y_mbs = [[t[start + i * micro:start + (i + 1) * micro] for t in ys] for i in range(m)]
            y_mbs = [v[0] if not isinstance(y, (list, tuple)) else v for v in y_mbs]
        runner.begin_step(m)
        if training:
            actions = schedule_lib.build(self.schedule, runner.stage, self.num_stages, m)
        else:
            actions = [schedule_lib.Action("F", i) for i in range(m)]
        began = tf.timestamp()
        for action in actions:
            if action.kind == "F":
                runner.forward(action.microbatch, x_mbs[action.microbatch] if runner.is_first else None,
                               y_mbs[action.microbatch] if runner.is_last else None, training)
            else:
                runner.backward(action.microbatch)
        runner.stats.seconds = float(tf.timestamp() - began)
        grads = None
        if training:
            grads = runner.var_grads if runner.var_grads is not None else [tf.zeros_like(v) for v in runner.variables]
            grads = self._sync(grads)
        loss, y_pred = self._share_outputs(batch, start, shard, with_loss=y is not None)
        return loss, y_pred, grads

    def _share_outputs(self, batch: int, start: int, shard: int, with_loss: bool):
        """Global loss and the whole batch's predictions on every rank (one fused world allreduce)."""
        runner, d = self._runner, self.topology.dp_size
        tensors = []
        for k, t in enumerate(self._graph.output_ids):
            spec = self._graph.tensors[t]
            tail = list(spec.shape[1:])
            if any(dim is None for dim in tail):
                raise ValueError(f"model output {spec.name} needs a fully defined shape after the batch dimension")
            dtype = tf.as_dtype(spec.dtype)
            if runner.is_last:
                local = tf.concat([runner.outputs[i][k] for i in range(self.num_microbatches)], 0)
                full = tf.concat([tf.zeros([start] + tail, dtype), tf.cast(local, dtype),
                                  tf.zeros([batch - start - shard] + tail, dtype)], 0)
            else:
                full = tf.zeros([batch] + tail, dtype)
            tensors.append(tf.cast(full, tf.float32) if dtype not in _REDUCIBLE else full)
        loss = tf.zeros([], tf.float32)
        if runner.is_last and with_loss:
            loss = tf.add_n([runner.losses[i] for i in range(self.num_microbatches)]) / self.num_microbatches
        reduced = sd.grouped_allreduce([loss] + tensors, op=sd.Sum, name="pipeline.outputs")
        outputs = [tf.cast(r, tf.as_dtype(self._graph.tensors[t].dtype)) for r, t in zip(reduced[1:], self._graph.output_ids)]
        return reduced[0] / d, outputs[0] if len(outputs) == 1 else outputs

    # -- checkpoints -----------------------------------------------------------------------------

    def gather_weights(self) -> None:
        """Copies every stage's current weights into every rank's unpartitioned model (collective)."""
        topo = self.topology
        variables = [v for v in self.unpartitioned.variables if tf.as_dtype(v.dtype) in _REDUCIBLE]
        values = []
        for v in variables:
            owner = self._variable_stages.get(id(v), [0])[0]
            mine = topo.pp_rank == owner and topo.dp_rank == 0
            values.append(tf.convert_to_tensor(v) if mine else tf.zeros(v.shape, v.dtype))
        for v, value in zip(variables, sd.grouped_allreduce(values, op=sd.Sum, name="pipeline.gather_weights")):
            v.assign(value)

    def save_weights(self, filepath: Union[str, os.PathLike], overwrite: bool = True, **kwargs) -> None:
        """Saves the unpartitioned model's weights (a ``.weights.h5`` file any stage count can load).

        Collective: call it on every rank; rank 0 writes the file.
        """
        self.gather_weights()
        if sd.rank() == 0:
            self.unpartitioned.save_weights(filepath, overwrite=overwrite, **kwargs)
        sd.barrier(name="pipeline.save_weights")

    def load_weights(self, filepath: Union[str, os.PathLike], **kwargs) -> None:
        """Loads unpartitioned weights (saved with any number of stages, or by the plain Keras model) on every rank."""
        self.unpartitioned.load_weights(filepath, **kwargs)

    def _stage_file(self, directory: Union[str, os.PathLike]) -> str:
        return os.path.join(os.fspath(directory), f"stage-{self.topology.pp_rank}-of-{self.num_stages}.npz")

    def _stage_weight_variables(self) -> dict:
        """This stage's variables keyed by their position in the unpartitioned model (names differ between instances)."""
        position = {id(v): k for k, v in enumerate(self.unpartitioned.variables)}
        out = {}
        for c in self._runner.calls:
            for v in c.layer.variables:
                out[f"variable_{position[id(v)]}"] = v
        return out

    def save_stage_weights(self, directory: Union[str, os.PathLike]) -> str:
        """Writes this stage's weights to ``directory/stage-S-of-P.npz`` (first replica of each stage). Collective."""
        path = self._stage_file(directory)
        if self.topology.dp_rank == 0:
            os.makedirs(os.fspath(directory), exist_ok=True)
            np.savez(path, **{key: np.asarray(v) for key, v in self._stage_weight_variables().items()})
        sd.barrier(name="pipeline.save_stage_weights")
        return path

    def load_stage_weights(self, directory: Union[str, os.PathLike]) -> None:
        """Loads the file :meth:`save_stage_weights` wrote for this stage (same stage count)."""
        with np.load(self._stage_file(directory)) as data:
            for key, v in self._stage_weight_variables().items():
                if key not in data or data[key].shape != tuple(v.shape):
                    raise ValueError(f"{self._stage_file(directory)} does not match this stage's {v.path}")
                v.assign(data[key])
