"""Every reach of smdist_tf into TensorFlow's and Keras' private internals, in one place.

The uneven-data support's first. Keras 3 gives ``fit`` no public hook between the last training step of an epoch and
the work that follows it: reading the metrics (collectives under a ``tf.distribute``
strategy), validation, and only then the callbacks' ``on_epoch_end``. A rank that ran
out of data must ``join()`` right there (smdist_tf/keras/uneven_data.py), so this
module patches ``keras.Model``. Each reach, and the Keras 3.15 behaviour it relies on:

* ``keras.Model.fit`` and ``keras.Model.evaluate`` are wrapped (public methods,
  monkeypatched): ``fit`` so its ``callbacks`` argument gets one more callback, both so
  the hook below knows which loop just ended.
* ``keras.Model._get_metrics_result_or_logs`` (private) is wrapped: ``fit`` calls it
  once per epoch, right after the epoch's last training step on this rank and before
  validation and ``on_epoch_end``; ``evaluate`` calls it once, after its last step.
  Keras 2 (``tf_keras.Model``, tf-keras 2.21) calls ``_validate_and_get_metrics_result``
  at the same two places, and that is wrapped instead.
* ``CallbackList.callbacks`` (undocumented) is the list a ``CallbackList`` calls, in
  order; a ``CallbackList`` the user passes to ``fit`` gets one more callback there.
  Keras 2's ``CallbackList`` decides once, in ``__init__``, whether to call batch hooks
  at all (``_should_call_train_batch_hooks``, private): set when the callback is added.
* ``Callback.params["steps"]`` (set by ``fit``) is the number of batches per epoch:
  ``steps_per_epoch`` when given, else the data's length when Keras knows it, else
  ``None``. When the data runs out before that, Keras warns and ends the epoch early
  on that rank alone.

The other reaches, by the module that makes them:

* SyncBatchNormalization (smdist_tf/sync_batch_norm.py), object collectives
  (smdist_tf/objects.py): below, with the functions that make them.
* Collectives (smdist_tf/collectives.py) read ``tf.Graph.experimental_acd_manager`` (set on
  every graph: TF's ``AutomaticControlDependencies`` while a ``tf.function`` traces, else
  None) and call its ``run_independently(op)`` on each collective op, which lets a step's
  collectives run, and fuse, as their inputs get ready (without it: one at a time).
* DataParallelStrategy (smdist_tf/distribute/strategy.py) subclasses
  ``tf.distribute.MultiWorkerMirroredStrategy`` without running its ``__init__`` (it calls
  ``tf.distribute.Strategy.__init__``), so Keras treats it as multi-worker.
* DataParallelExtended (smdist_tf/distribute/extended.py) subclasses ``MirroredExtended``
  (the names in ``_INTERNALS`` below are the values, input and regrouping helpers it works
  with). It overrides ``_num_replicas_in_sync`` (a property), ``_get_replica_id_in_sync_group``,
  ``_get_local_replica_id``, ``_in_multi_worker_mode``, ``_use_merge_call``,
  ``_get_cross_device_ops``, ``_create_variable``, ``_get_variable_creator_initial_value``,
  ``_experimental_distribute_dataset``, ``_distribute_datasets_from_function``,
  ``_experimental_distribute_values_from_function``, ``_reduce_to``, ``_batch_reduce_to``,
  ``_gather_to_implementation``, ``_replica_ctx_all_reduce`` and ``_replica_ctx_update``;
  sets ``_collective_ops`` and ``_cluster_resolver``; reads ``_cross_device_ops``; calls
  ``_container_strategy()``, ``_input_workers_with_options(options)`` and
  ``DistributedVariable._get_replica(0)``.
* SmdistCrossDeviceOps (smdist_tf/distribute/cross_device_ops.py) overrides
  ``CrossDeviceOps._num_between_graph_workers`` (a property), ``_gather_implementation`` and
  ``_all_reduce``, and reads ``CommunicationOptions.bytes_per_pack``.
* PipelineModel (smdist_tf/pipeline/) streams ``.weights.h5`` checkpoints through Keras'
  saving internals (``save_state`` below; ``H5IOStore``: ``get``, ``in``, ``[]``, ``close``
  and ``_h5_entry_group``, and a subclass that skips its ``__init__``, sets ``mode`` and
  overrides ``make``, ``__setitem__``, ``close`` and ``__bool__``), keeps a stage's
  variables deferred (``keras.Variable._value``, ``._initializer``, ``._dtype``,
  ``._deferred_initialize()``, ``._initialize()``, and Keras' global
  ``uninitialized_variables`` list), walks functional graphs (``Functional`` below,
  ``Sequential._functional``, ``Functional._nodes_by_depth`` and its nodes' ``operation``,
  ``is_input``, ``input_tensors``, ``outputs`` and ``arguments.fill_in()``,
  ``Layer._call_has_training_arg``, ``Layer._flatten_layers()``,
  ``Layer._get_own_losses()``), and updates ``Model._loss_tracker`` (the ``loss`` metric).
* ``OffloadActivations`` (smdist_tf/pipeline/offload.py) calls the same
  ``Layer._flatten_layers()`` and ``Layer._get_own_losses()`` on the layer it wraps, to refuse
  one that added losses in its call (their gradient would not reach its weights).
* ``smdist_tf.keras.callbacks.ModelCheckpoint`` (smdist_tf/keras/callbacks.py) overrides
  ``ModelCheckpoint._save_model`` (``keras.callbacks``' and ``tf_keras.callbacks``').
* The Keras 3 ``DistributedOptimizer`` (smdist_tf/keras/optimizer.py) reads
  ``Optimizer._trainable_variables`` and calls ``Optimizer._get_variable_index(variable)``;
  the Keras 2 one (smdist_tf/keras/tf_keras_optimizer.py) overrides
  ``tf_keras.optimizers.legacy.Optimizer._aggregate_gradients``.
* Global patches of public methods (smdist_tf/keras/patches.py): besides the training
  loops above, ``keras.optimizers.LossScaleOptimizer.check_finite`` (keras/loss_scale.py),
  ``keras.Model.predict_on_batch`` (keras/predict_on_batch.py) and
  ``keras.optimizers.Optimizer.__init__`` (sharding/strategy_hook.py, which reads the new
  optimizer's ``_distribution_strategy``) and ``keras.layers.Layer.__call__`` (sharding/regather.py);
  and one private method, ``keras.optimizers.Optimizer._all_reduce_sum_gradients`` (inherited from ``TFOptimizer``;
  keras/strategy_gradients.py, which reads ``_distribution_strategy`` too): Keras 3.15's
  ``TFOptimizer._backend_update_step`` calls it with the ``(gradient, variable)`` pairs, and it
  alone reduces an optimizer's gradients under a strategy (the replica context's ``all_reduce(SUM)``).
* Optimizer-state sharding (smdist_tf/sharding/) puts a mixin in front of an optimizer's
  class (assigning ``__class__``) that overrides Keras' ``_clip_gradients``,
  ``_backend_update_step``, ``_backend_apply_gradients`` and TensorFlow's
  ``Trackable._trackable_children``, replaces ``TFOptimizer._all_reduce_sum_gradients``, and
  uses ``_var_key``, ``_get_variable_index``, ``_trainable_variables_indices``,
  ``_accumulated_gradients``, ``_iterations``, ``_apply_weight_decay``,
  ``_backend_increment_gradient_accumulators``, ``_backend_reset_gradient_accumulators``
  and ``_distribution_strategy``. It tells slots apart by the names Keras gives
  ``add_variable_from_reference``: ``average`` (the EMA, kept full-size) and
  ``gradient_accumulator`` (sharded in stage 2 only).
* Parameter sharding (ZeRO stage 3, smdist_tf/sharding/parameter.py and piece_optimizer.py)
  relies on the Keras 3.15 TensorFlow ``Variable`` keeping whatever ``tf.Variable(...)``
  returned in ``_value`` (read to find the ``ShardedParameter`` behind a weight), on
  ``TFOptimizer._var_key`` keying a variable by ``_unique_id`` (``ShardedParameter`` gives its
  piece's, read from the piece), and puts a mixin in front of an optimizer's class that
  replaces ``TFOptimizer._all_reduce_sum_gradients``. The strategy's ``_create_variable``
  (above) makes the pieces. Its ``keras.layers.Layer.__call__`` wrapper (a public method,
  installed by smdist_tf/keras/patches.py; smdist_tf/sharding/regather.py) calls
  ``Layer._flatten_layers(include_self=False, recursive=False)`` to tell a layer that owns
  its weights from one that holds other layers, and carries Keras masks across its custom
  gradient with ``keras.src.backend.common.masking.get_keras_mask``/``set_keras_mask`` (the
  gradient's ``IdentityN`` outputs, and the backward's recomputed input, are new tensors).
* ``keras.distribution`` on the TensorFlow backend (smdist_tf/keras/distribution_backend.py,
  smdist_tf/keras/distribution_activation.py). Keras' ``keras.src.distribution.distribution_lib``
  calls the backend's module, ``keras.src.backend.distribution_lib`` (for TensorFlow
  ``keras.src.backend.tensorflow.distribution_lib``, a prototype), by attribute at each call:
  ``initialize``, ``list_devices``, ``get_device_count``, ``num_processes`` and ``process_id``
  (read by ``Distribution.__init__`` only when the module has both), ``distribute_tensor``,
  ``_to_backend_mesh`` and ``_to_backend_layout``; JAX's trainer also calls ``distribute_data_input``.
  smdist_tf sets these on that module. ``set_distribution`` (and so
  ``Distribution.scope()``) stores the distribution with
  ``keras.src.backend.common.global_state.set_global_attribute(GLOBAL_ATTRIBUTE_NAME, value)``,
  looking the function up on the module at each call: smdist_tf wraps it there, so a distribution
  becoming current (or ending) sets ``DataParallelStrategy`` globally (or unsets it). A
  ``ModelParallel``'s layouts are read from its ``_layout_map`` (no public accessor).
* ``smdist_tf.testing.DistributedTestCase`` (a ``tf.test.TestCase``) reads unittest's
  ``TestCase._testMethodName``.

tests/test_compat.py checks each of these against the installed TensorFlow and Keras,
and that no other module reaches into ``keras.src`` or ``tensorflow.python``, so an
upgrade that moves one fails there, loudly, rather than hanging a job.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import weakref
from typing import Any, Callable, Optional

from smdist_tf.keras_api import is_tf_keras_class

# Internal names other modules take from here, as ``_compat.<name>``: resolved on first use
# (PEP 562), so importing this module imports neither TensorFlow nor Keras.
_INTERNALS = {
    "DistributedValues": ("tensorflow.python.distribute.values", "DistributedValues"),
    "DistributedVariable": ("tensorflow.python.distribute.values", "DistributedVariable"),
    "Mirrored": ("tensorflow.python.distribute.values", "Mirrored"),
    "regroup": ("tensorflow.python.distribute.distribute_utils", "regroup"),
    "get_distributed_dataset": ("tensorflow.python.distribute.input_util", "get_distributed_dataset"),
    "get_distributed_datasets_from_function": ("tensorflow.python.distribute.input_util",
                                               "get_distributed_datasets_from_function"),
    "MirroredExtended": ("tensorflow.python.distribute.mirrored_strategy", "MirroredExtended"),
    "CheckpointInitialValue": ("tensorflow.python.trackable.base", "CheckpointInitialValue"),
    "Functional": ("keras.src.models.functional", "Functional"),
    "H5IOStore": ("keras.src.saving.saving_lib", "H5IOStore"),
    "save_state": ("keras.src.saving.saving_lib", "_save_state"),
    "get_global_attribute": ("keras.src.backend.common.global_state", "get_global_attribute"),
    "set_global_attribute": ("keras.src.backend.common.global_state", "set_global_attribute"),
    "get_keras_mask": ("keras.src.backend.common.masking", "get_keras_mask"),
    "set_keras_mask": ("keras.src.backend.common.masking", "set_keras_mask"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _INTERNALS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # once resolved, a plain module attribute
    return value

PrepareFit = Callable[[Any, Any], tuple[Any, Any]]
# The model method each Keras calls right after the last step of a training epoch or an evaluation.
_METRICS_READ = {"keras": "_get_metrics_result_or_logs", "tf_keras": "_validate_and_get_metrics_result"}
LoopEnd = Callable[[Any, str, Any], None]


def epoch_steps(params: Optional[dict]) -> Optional[int]:
    """The batches per epoch ``fit`` announced to its callbacks, or None when unknown."""
    steps = (params or {}).get("steps")
    return None if steps is None else int(steps)


def append_callback(callback_list: Any, callback: Any) -> None:
    """Adds ``callback`` last to a ``keras.callbacks.CallbackList``, replacing any of its type there."""
    kept = [c for c in callback_list.callbacks if not isinstance(c, type(callback))]
    callback_list.callbacks = kept + [callback]
    callback.set_params(getattr(callback_list, "params", {}))  # a Keras 2 list made without any has none
    # A version switch, not a fallback: Keras 2's CallbackList has it, Keras 3's has none
    # (tests/test_compat.py checks both).
    if hasattr(callback_list, "_should_call_train_batch_hooks"):
        callback_list._should_call_train_batch_hooks = True


def hook_training_loops(cls: type, prepare_fit: PrepareFit, loop_end: LoopEnd) -> None:
    """Patches ``cls.fit``, ``cls.evaluate`` and ``cls._get_metrics_result_or_logs``.

    Args:
        cls: the model class to patch (``keras.Model`` to reach every model, or Keras 2's
            ``tf_keras.Model``).
        prepare_fit: called as ``prepare_fit(model, callbacks)`` at the start of each
            ``fit`` with its ``callbacks`` argument; returns ``(callbacks, state)``:
            the callbacks ``fit`` runs with, and what ``loop_end`` gets for this fit.
        loop_end: called as ``loop_end(model, loop, state)`` when the training loop of
            an epoch (``loop="fit"``) or an evaluation (``loop="evaluate"``, ``state``
            None) has run its last step on this rank, before Keras reads the metrics.
    """
    keras_fit, keras_evaluate = cls.fit, cls.evaluate
    metrics_read = _METRICS_READ["tf_keras" if is_tf_keras_class(cls) else "keras"]
    keras_metrics_or_logs = getattr(cls, metrics_read)
    fit_signature = inspect.signature(keras_fit)
    # Which loops ("fit", "evaluate") run per model, innermost last, with the state prepare_fit
    # returned; per hooked class (a hooked subclass of a hooked class has its own), weak, so
    # models can be freed.
    running: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def run_as(model: Any, loop: str, state: Any, call: Callable[[], Any]) -> Any:
        loops = running.setdefault(model, [])
        loops.append((loop, state))
        try:
            return call()
        finally:
            loops.pop()

    @functools.wraps(keras_fit)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = fit_signature.bind(self, *args, **kwargs)
        except TypeError:
            return keras_fit(self, *args, **kwargs)  # Keras words the error
        callbacks, state = prepare_fit(self, bound.arguments.get("callbacks"))
        bound.arguments["callbacks"] = callbacks
        return run_as(self, "fit", state, lambda: keras_fit(*bound.args, **bound.kwargs))

    @functools.wraps(keras_evaluate)
    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run_as(self, "evaluate", None, lambda: keras_evaluate(self, *args, **kwargs))

    @functools.wraps(keras_metrics_or_logs)
    def get_metrics_result_or_logs(self: Any, logs: Any) -> Any:
        loops = running.get(self)
        if loops:
            loop_end(self, *loops[-1])
        return keras_metrics_or_logs(self, logs)

    cls.fit, cls.evaluate = fit, evaluate
    setattr(cls, metrics_read, get_metrics_result_or_logs)


# SyncBatchNormalization (smdist_tf/sync_batch_norm.py) overrides
# keras.layers.BatchNormalization._moments(inputs, mask) (private), which call() uses in
# training for the batch mean and variance (not keepdims), and reads
# BatchNormalization._reduction_axes (private), the axes those statistics reduce.


def batch_norm_local_moments(layer: Any, inputs: Any, mask: Any) -> tuple[Any, Any]:
    """Keras' own per-rank ``BatchNormalization._moments``."""
    import keras

    return keras.layers.BatchNormalization._moments(layer, inputs, mask)


def batch_norm_reduction_axes(layer: Any) -> list:
    """The axes ``BatchNormalization`` computes its statistics over."""
    return list(layer._reduction_axes)


# broadcast_object / allgather_object (smdist_tf/objects.py) exchange Python values, so
# they run eagerly even when called while a graph is built: tensorflow.python.eager.
# context.eager_mode() (private) switches to eager execution inside a tf.compat.v1 graph
# or a tf.function being traced, where tf.init_scope() would stay in the user's graph.


def eager_scope() -> Any:
    """A context in which TensorFlow executes eagerly, whatever graph is being built."""
    from tensorflow.python.eager import context

    return context.eager_mode()


def keras_backend_distribution_lib() -> Any:
    """The module ``keras.distribution`` calls into for the TensorFlow backend (a prototype in Keras 3.15)."""
    return importlib.import_module("keras.src.backend.tensorflow.distribution_lib")


def keras_global_state() -> Any:
    """Keras' ``global_state`` module, whose ``set_global_attribute`` ``set_distribution`` calls."""
    return importlib.import_module("keras.src.backend.common.global_state")


def keras_distribution_attribute() -> str:
    """The global attribute ``keras.distribution.set_distribution`` stores the distribution under."""
    return importlib.import_module("keras.src.distribution.distribution_lib").GLOBAL_ATTRIBUTE_NAME
