"""The Keras internals smdist_tf/_compat.py reaches into still behave as it relies on.

Single process. A Keras upgrade that moves one of these fails here, by name, instead of
letting uneven data hang a multi-rank job.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk
from smdist_tf import _compat
from tests.mpi_harness import ROOT, mpi_env

X = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)


def dataset(batches: int) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((X, Y)).take(10 * batches).batch(10)


class Recording:
    """Writes every hook fit and evaluate call, in order, into ``events`` (mixed into either Keras' Callback)."""

    def __init__(self, events: list) -> None:
        super().__init__()
        self.events = events

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(f"epoch_begin {epoch}")

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(f"train_batch {batch}")

    def on_test_begin(self, logs=None):
        self.events.append("test_begin")

    def on_test_batch_end(self, batch, logs=None):
        self.events.append(f"test_batch {batch}")

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(f"epoch_end {epoch}")


class Recorder(Recording, keras.callbacks.Callback):
    pass


def hooked_model_class(events: list, state: object, keras_module=keras) -> type:
    """A Sequential subclass (of ``keras_module``) with _compat's hooks recording into ``events``."""

    class Hooked(keras_module.Sequential):
        pass

    recorder = type("Recorder", (Recording, keras_module.callbacks.Callback), {})

    def prepare_fit(model, callbacks):
        events.append(f"prepare_fit {len(callbacks)} callbacks")
        return [*callbacks, recorder(events)], state

    def loop_end(model, loop, loop_state):
        events.append(f"loop_end {loop} {'state' if loop_state is state else loop_state}")

    _compat.hook_training_loops(Hooked, prepare_fit, loop_end)
    return Hooked


def compiled(cls: type = keras.Sequential) -> keras.Model:
    model = cls([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class KerasReachesTest(tf.test.TestCase):
    def test_the_patched_methods_exist_with_the_arguments_used(self):
        for name in ("fit", "evaluate", "_get_metrics_result_or_logs"):
            self.assertTrue(callable(getattr(keras.Model, name, None)), f"keras.Model.{name} is gone")
        self.assertIn("callbacks", inspect.signature(keras.Model.fit).parameters)
        self.assertEqual(list(inspect.signature(keras.Model._get_metrics_result_or_logs).parameters), ["self", "logs"])

    def test_loop_end_comes_after_the_last_step_and_before_validation_and_epoch_end(self):
        events, state = [], object()
        model = compiled(hooked_model_class(events, state))
        model.fit(dataset(3), epochs=2, validation_data=dataset(1), callbacks=[], verbose=0)
        per_epoch = lambda e: [f"epoch_begin {e}", "train_batch 0", "train_batch 1", "train_batch 2",  # noqa: E731
                               "loop_end fit state", "test_begin", "test_batch 0", "loop_end evaluate None",
                               f"epoch_end {e}"]
        self.assertEqual(events, ["prepare_fit 0 callbacks", *per_epoch(0), *per_epoch(1)])

        events.clear()
        model.evaluate(dataset(2), verbose=0)
        self.assertEqual(events, ["loop_end evaluate None"])

        events.clear()  # callbacks passed by position reach prepare_fit too
        model.fit(X, Y, 20, 1, 0, [keras.callbacks.History()])
        self.assertEqual(events[:2], ["prepare_fit 1 callbacks", "epoch_begin 0"])
        self.assertEqual(events[-3:], ["train_batch 1", "loop_end fit state", "epoch_end 0"])

    def test_a_callback_appended_to_a_users_callback_list_runs_last(self):
        class Appended(Recorder):
            pass

        events, appended_events = [], []
        model = compiled()
        callback_list = keras.callbacks.CallbackList([Recorder(events)], add_history=True, model=model, steps=2)
        _compat.append_callback(callback_list, Appended([]))
        appended = Appended(appended_events)
        _compat.append_callback(callback_list, appended)  # replaces the earlier Appended
        appended.set_model(model)
        self.assertEqual(len(callback_list.callbacks), 3)  # with History
        self.assertIs(callback_list.callbacks[-1], appended)
        self.assertEqual(_compat.epoch_steps(appended.params), 2)
        model.fit(X, Y, batch_size=20, epochs=1, callbacks=callback_list, verbose=0)
        self.assertEqual(appended_events, events)
        self.assertIn("train_batch 1", appended_events)

    def test_steps_param_and_running_out_of_data(self):
        seen = []

        class Steps(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                seen.append(_compat.epoch_steps(self.params))

        unknown = dataset(2).filter(lambda x, y: True)
        for data, steps_per_epoch in [(dataset(3), None), (dataset(3), 2), (unknown, None)]:
            compiled().fit(data, epochs=1, steps_per_epoch=steps_per_epoch, callbacks=[Steps()], verbose=0)
        self.assertEqual(seen, [3, 2, None])  # the data's length, steps_per_epoch, unknown

        # Running out before steps_per_epoch: Keras warns and ends only that epoch early.
        events = []
        model = compiled()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(dataset(3), epochs=2, steps_per_epoch=2, callbacks=[Recorder(events)], verbose=0)
        self.assertEqual(events, ["epoch_begin 0", "train_batch 0", "train_batch 1", "epoch_end 0",
                                  "epoch_begin 1", "train_batch 0", "epoch_end 1"])
        self.assertFalse(model.stop_training)
        self.assertTrue(any("ran out of data" in str(w.message) for w in caught))


class InstalledHooksTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sd.init()

    def test_distributed_optimizer_installs_the_hooks_and_one_rank_fits_as_keras_does(self):
        model = compiled()
        model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.assertIsNot(keras.Model.fit, inspect.unwrap(keras.Model.fit))
        events = []
        history = model.fit(dataset(2), epochs=2, callbacks=[Recorder(events)], verbose=0)
        self.assertEqual(len(history.history["loss"]), 2)
        self.assertEqual(events.count("train_batch 1"), 2)

    def test_plain_keras_fit_and_evaluate_work_once_the_engine_is_down(self):
        # The hooks see every model: they must not need a running engine.
        code = (
            "import keras, numpy as np, smdist_tf as sd\n"
            "sd.init(); sd.keras.DistributedOptimizer(keras.optimizers.SGD()); sd.shutdown()\n"
            "model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])\n"
            "model.compile(optimizer='sgd', loss='mse')\n"
            "x = np.ones((8, 4), 'float32')\n"
            "model.fit(x, x[:, :1], epochs=2, verbose=0); model.evaluate(x, x[:, :1], verbose=0)\n"
            "print('fit ok')\n"
        )
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                                timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("fit ok", result.stdout)


def test_batch_norm_moments_and_axes_are_what_sync_batch_norm_overrides():
    """SyncBatchNormalization overrides BatchNormalization._moments(inputs, mask) and reads _reduction_axes."""
    assert list(inspect.signature(keras.layers.BatchNormalization._moments).parameters) == ["self", "inputs", "mask"]
    layer = keras.layers.BatchNormalization()
    x = tf.constant(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    layer(x, training=True)  # builds
    assert _compat.batch_norm_reduction_axes(layer) == [0, 1]
    mean, variance = _compat.batch_norm_local_moments(layer, x, None)
    np.testing.assert_allclose(mean, x.numpy().mean(axis=(0, 1)), rtol=1e-6)
    np.testing.assert_allclose(variance, x.numpy().var(axis=(0, 1)), rtol=1e-5)
    # call() takes its training statistics from _moments: an override changes the output.
    calls = []

    class Probe(keras.layers.BatchNormalization):
        def _moments(self, inputs, mask):
            calls.append(True)
            return super()._moments(inputs, mask)

    Probe()(x, training=True)
    assert calls, "BatchNormalization.call no longer uses _moments"


def test_eager_scope_executes_eagerly_inside_graphs():
    """objects.py relies on it to exchange Python values while a graph is built or traced."""
    with tf.Graph().as_default():
        assert not tf.executing_eagerly()
        with _compat.eager_scope():
            assert int((tf.constant(2) * 3).numpy()) == 6
    seen = []

    @tf.function
    def traced():
        with _compat.eager_scope():
            seen.append(int(tf.constant(5).numpy()))
        return tf.constant(0)

    traced()
    assert seen == [5]


class InternalReachesTest(tf.test.TestCase):
    """The strategy's, the pipeline's and the callbacks' reaches that _compat.py lists, against the installed versions."""

    def test_every_internal_name_resolves(self):
        for name in _compat._INTERNALS:
            self.assertTrue(callable(getattr(_compat, name)), name)
        self.assertTrue(issubclass(_compat.MirroredExtended, tf.distribute.StrategyExtended))
        self.assertTrue(issubclass(_compat.Mirrored, _compat.DistributedValues))
        with self.assertRaises(AttributeError):
            _compat.NotAnInternal  # noqa: B018

    def test_overridden_and_called_private_methods_exist_with_the_arguments_used(self):
        def params(fn):
            return list(inspect.signature(fn).parameters)

        self.assertEqual(params(_compat.MirroredExtended._create_variable)[:2], ["self", "next_creator"])
        self.assertIn("replica_id", params(_compat.MirroredExtended._get_variable_creator_initial_value))
        self.assertTrue(callable(_compat.DistributedVariable._get_replica))
        self.assertEqual(params(keras.callbacks.ModelCheckpoint._save_model), ["self", "epoch", "batch", "logs"])
        self.assertIn("inner_path", params(_compat.save_state))
        for name in ("_deferred_initialize", "_initialize"):
            self.assertTrue(callable(getattr(keras.Variable, name)), name)
        v = keras.Variable(1.0)
        for name in ("_value", "_initializer", "_dtype"):
            self.assertTrue(hasattr(v, name), name)
        inputs = keras.Input((2,))
        functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        self.assertTrue(functional._nodes_by_depth)
        for name in ("_flatten_layers", "_get_own_losses"):
            self.assertTrue(callable(getattr(keras.layers.Layer, name)), name)
        self.assertIsInstance(_compat.get_global_attribute("uninitialized_variables", []), list)

    def test_the_optimizer_internals_sharding_relies_on(self):
        def params(fn):
            return list(inspect.signature(fn).parameters)

        optimizer = keras.optimizers.Adam(gradient_accumulation_steps=2)
        self.assertIs(optimizer._distribution_strategy, tf.distribute.get_strategy())
        self.assertEqual(params(type(optimizer)._clip_gradients), ["self", "grads"])
        self.assertEqual(params(type(optimizer)._backend_update_step),
                         ["self", "grads", "trainable_variables", "learning_rate"])
        self.assertEqual(params(type(optimizer)._backend_apply_gradients), ["self", "grads", "trainable_variables"])
        self.assertEqual(params(type(optimizer)._all_reduce_sum_gradients), ["self", "grads_and_vars"])
        self.assertEqual(params(type(optimizer)._apply_weight_decay), ["self", "variables"])
        self.assertEqual(params(type(optimizer)._backend_increment_gradient_accumulators),
                         ["self", "grads", "acc_grads"])
        self.assertTrue(callable(optimizer._backend_reset_gradient_accumulators))
        self.assertIn("save_type", params(tf.Module._trackable_children))
        variable = keras.Variable(np.zeros(3, np.float32))
        optimizer.build([variable])
        self.assertEqual(optimizer._trainable_variables_indices, {optimizer._var_key(variable): 0})
        # Keyed by the tf.Variable's _unique_id: a ShardedParameter's (its piece's) keys it the same way.
        self.assertEqual(optimizer._var_key(variable), variable.value._unique_id)
        # The slot names sharding/optimizer.py keeps full-size or shards by.
        from smdist_tf.sharding.optimizer import _ACCUMULATOR_SLOT, _FULL_SIZE_SLOTS

        names = []
        with_ema = keras.optimizers.SGD(use_ema=True, gradient_accumulation_steps=2)
        keras_add = with_ema.add_variable_from_reference

        def recording(reference_variable, name=None, initializer="zeros"):
            names.append(name)
            return keras_add(reference_variable, name=name, initializer=initializer)

        with_ema.add_variable_from_reference = recording  # build calls it on the optimizer, as the mixin overrides
        with_ema.build([keras.Variable(np.zeros(3, np.float32))])
        self.assertEqual(sorted(names), sorted([*_FULL_SIZE_SLOTS, _ACCUMULATOR_SLOT]))
        self.assertEqual([tuple(a.shape) for a in optimizer._accumulated_gradients], [(3,)])
        self.assertEqual(int(optimizer._iterations.numpy()), 0)

    def test_keras_reduces_an_optimizers_gradients_in_one_call_adasum_replaces(self):
        # smdist_tf/keras/strategy_gradients.py wraps it on keras.optimizers.Optimizer (TFOptimizer's).
        optimizer = keras.optimizers.SGD(0.5)
        variable = keras.Variable(np.ones(2, np.float32))
        seen = []
        keras_sum = optimizer._all_reduce_sum_gradients

        def recording(grads_and_vars):
            pairs = list(grads_and_vars)
            seen.append([(np.asarray(g), v) for g, v in pairs])
            return keras_sum(pairs)

        optimizer._all_reduce_sum_gradients = recording  # the update step calls it on the optimizer
        optimizer.apply([tf.constant([2.0, 4.0])], [variable])
        self.assertLen(seen, 1)
        (grad, var), = seen[0]
        self.assertAllEqual(grad, [2.0, 4.0])
        self.assertIs(var, variable.value)
        self.assertAllClose(variable.numpy(), [0.0, -1.0])

    def test_no_other_module_imports_keras_or_tensorflow_internals(self):
        importing = re.compile(r"^\s*(from|import)\s+(keras\.src|tf_keras\.src|tensorflow\.python)\b", re.M)
        for path in sorted((ROOT / "smdist_tf").rglob("*.py")):
            if path.name == "_compat.py":
                continue
            self.assertIsNone(importing.search(path.read_text()), f"{path} reaches into internals itself")


class TfKerasReachesTest(tf.test.TestCase):
    """Keras 2's reaches (tf-keras, for TF_USE_LEGACY_KERAS=1), used from this Keras 3 process directly."""

    def setUp(self):
        super().setUp()
        self.tf_keras = __import__("pytest").importorskip("tf_keras")

    def test_the_hooked_and_overridden_methods_exist_with_the_arguments_used(self):
        tf_keras = self.tf_keras

        def params(fn):
            return list(inspect.signature(fn).parameters)

        for name in ("fit", "evaluate", "_validate_and_get_metrics_result"):
            self.assertTrue(callable(getattr(tf_keras.Model, name, None)), f"tf_keras.Model.{name} is gone")
        self.assertIn("callbacks", params(tf_keras.Model.fit))
        self.assertEqual(params(tf_keras.Model._validate_and_get_metrics_result), ["self", "logs"])
        self.assertEqual(params(tf_keras.callbacks.ModelCheckpoint._save_model), ["self", "epoch", "batch", "logs"])
        self.assertEqual(params(tf_keras.optimizers.Optimizer.aggregate_gradients), ["self", "grads_and_vars"])
        self.assertEqual(params(tf_keras.optimizers.legacy.Optimizer._aggregate_gradients), ["self", "grads_and_vars"])
        callback_list = tf_keras.callbacks.CallbackList([])
        self.assertFalse(callback_list._should_call_train_batch_hooks)
        _compat.append_callback(callback_list, tf_keras.callbacks.Callback())
        self.assertTrue(callback_list._should_call_train_batch_hooks)

    def test_loop_end_comes_after_the_last_step_and_before_validation_and_epoch_end(self):
        tf_keras = self.tf_keras
        events, state = [], object()
        model = hooked_model_class(events, state, tf_keras)([tf_keras.layers.Dense(2, input_shape=(4,))])
        model.compile(optimizer="sgd", loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(dataset(3), epochs=2, validation_data=dataset(1), callbacks=[], verbose=0)
        per_epoch = lambda e: [f"epoch_begin {e}", "train_batch 0", "train_batch 1", "train_batch 2",  # noqa: E731
                               "loop_end fit state", "test_begin", "test_batch 0", "loop_end evaluate None",
                               f"epoch_end {e}"]
        self.assertEqual(events, ["prepare_fit 0 callbacks", *per_epoch(0), *per_epoch(1)])


# --- The whole inventory: every private TF/Keras name smdist_tf touches ---------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith("_smdist")


def _params(member) -> list:
    return list(inspect.signature(member.fget if isinstance(member, property) else member).parameters)


def _touched_private_names() -> dict:
    """Private names read, called or written on objects smdist_tf does not define, found in its source.

    A name counts as smdist_tf's own when some module of it defines it (``def``, a class, or
    ``self._name = ...``); overridden methods are checked by ``test_overrides...`` below.
    """
    import ast

    trees = {path: ast.parse(path.read_text()) for path in sorted((ROOT / "smdist_tf").rglob("*.py"))}
    defined = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(t, ast.Name):
                            defined.add(t.id)
                        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                            defined.add(t.attr)
    found: dict = {}
    for path, tree in trees.items():
        modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                   for a in n.names}
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if not (isinstance(node.value, ast.Name) and node.value.id in modules):  # a module's own name
                    name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value)):
                name = node.args[1].value
            if name is not None and name not in defined:
                found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _inventory() -> str:
    """smdist_tf/_compat.py's inventory: its docstring and the comments by its functions."""
    comments = "\n".join(line for line in inspect.getsource(_compat).splitlines() if line.lstrip().startswith("#"))
    return _compat.__doc__ + "\n" + comments


def _listed(name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", _inventory().replace(".", " ")) is not None


def _overrides() -> list:
    """(smdist_tf class, the TF/Keras class it derives from, a fresh instance of that class or None,
    the private methods and properties it overrides, the private attributes it sets on the TF/Keras object)."""
    from smdist_tf.distribute.cross_device_ops import SmdistCrossDeviceOps
    from smdist_tf.distribute.extended import DataParallelExtended
    from smdist_tf.distribute.strategy import DataParallelStrategy
    from smdist_tf.elastic import callbacks as elastic_callbacks
    from smdist_tf.keras import callbacks as keras_callbacks
    from smdist_tf.keras.checkpoint_callbacks import BestModelCheckpoint
    from smdist_tf.keras.schedule_callbacks import LearningRateScheduleCallback
    from smdist_tf.keras.uneven_data import _EpochSync
    from smdist_tf.pipeline.offload import OffloadActivations
    from smdist_tf.pipeline.model import PipelineModel, _FunctionLoss
    from smdist_tf.pipeline.weights import NotHeld, _RecordingStore
    from smdist_tf.sharding.optimizer import sharded_class
    from smdist_tf.sharding.piece_optimizer import piece_class
    from smdist_tf.sync_batch_norm import SyncBatchNormalization

    mirrored = tf.distribute.MirroredStrategy(["/cpu:0"])
    callback = keras.callbacks.Callback()
    checkpoint = keras.callbacks.ModelCheckpoint("unused.keras")
    adam = keras.optimizers.Adam()
    adam.build([keras.Variable(np.zeros(2, np.float32))])
    return [
        (DataParallelExtended, _compat.MirroredExtended, mirrored.extended,
         {"_num_replicas_in_sync", "_get_replica_id_in_sync_group", "_get_local_replica_id", "_in_multi_worker_mode",
          "_use_merge_call", "_get_cross_device_ops", "_create_variable", "_get_variable_creator_initial_value",
          "_experimental_distribute_dataset", "_distribute_datasets_from_function",
          "_experimental_distribute_values_from_function", "_reduce_to", "_batch_reduce_to",
          "_gather_to_implementation", "_replica_ctx_all_reduce", "_replica_ctx_update"},
         {"_collective_ops", "_cluster_resolver"}),
        (SmdistCrossDeviceOps, tf.distribute.CrossDeviceOps, tf.distribute.ReductionToOneDevice(),
         {"_num_between_graph_workers", "_gather_implementation", "_all_reduce"}, set()),
        (DataParallelStrategy, tf.distribute.MultiWorkerMirroredStrategy, mirrored, set(), set()),
        (SyncBatchNormalization, keras.layers.BatchNormalization, keras.layers.BatchNormalization(), {"_moments"}, set()),
        (PipelineModel, keras.Model, compiled(), set(), set()),
        (OffloadActivations, keras.layers.Wrapper, keras.layers.Wrapper(keras.layers.Dense(1)), set(), set()),
        (_EpochSync, keras.callbacks.Callback, callback, set(), set()),
        (_FunctionLoss, keras.losses.Loss, keras.losses.MeanSquaredError(), set(), set()),
        (NotHeld, keras.initializers.Initializer, keras.initializers.Zeros(), set(), set()),
        (_RecordingStore, _compat.H5IOStore, None, set(), set()),
        (keras_callbacks.ModelCheckpoint, keras.callbacks.ModelCheckpoint, checkpoint, {"_save_model"}, set()),
        (BestModelCheckpoint, keras.callbacks.ModelCheckpoint, checkpoint, set(), set()),
        (keras_callbacks.BroadcastGlobalVariablesCallback, keras.callbacks.Callback, callback, set(), set()),
        (keras_callbacks.MetricAverageCallback, keras.callbacks.Callback, callback, set(), set()),
        (keras_callbacks.LearningRateWarmupCallback, keras.callbacks.Callback, callback, set(), set()),
        (LearningRateScheduleCallback, keras.callbacks.Callback, callback, set(), set()),
        (elastic_callbacks.CommitStateCallback, keras.callbacks.Callback, callback, set(), set()),
        (elastic_callbacks.UpdateBatchStateCallback, keras.callbacks.Callback, callback, set(), set()),
        (elastic_callbacks.UpdateEpochStateCallback, keras.callbacks.Callback, callback, set(), set()),
        (sharded_class(keras.optimizers.Adam), keras.optimizers.Adam, adam,
         {"_clip_gradients", "_all_reduce_sum_gradients", "_backend_update_step", "_backend_apply_gradients",
          "_trackable_children"}, set()),
        (type(sk.DistributedOptimizer(keras.optimizers.Adam())), keras.optimizers.Adam, adam, set(), set()),
        (piece_class(keras.optimizers.Adam), keras.optimizers.Adam, adam, {"_all_reduce_sum_gradients"}, set()),
    ]


def _own_classes(cls: type, base: type) -> list:
    """The classes smdist_tf put in ``cls``'s MRO in front of ``base``'s."""
    return [k for k in cls.__mro__ if k not in base.__mro__ and k.__module__.startswith("smdist_tf")]


def _assigned_private_attributes(cls: type, base: type) -> set:
    """``self._name = ...`` in the source of smdist_tf's classes of ``cls``."""
    import ast
    import textwrap

    names = set()
    for klass in _own_classes(cls, base):
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(klass)))):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                                and _private(t.attr):
                            names.add(t.attr)
    return names


class PrivateNameInventoryTest(tf.test.TestCase):
    """Every private TF/Keras name smdist_tf touches is in _compat.py's inventory, and the installed versions have it."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sd.init()  # DistributedOptimizer

    def test_every_private_name_the_package_touches_is_listed(self):
        touched = _touched_private_names()
        self.assertIn("_loss_tracker", touched)  # the scan sees reads (pipeline/model.py)
        for name, places in sorted(touched.items()):
            self.assertTrue(_listed(name), f"{name} ({', '.join(places)}) is missing from smdist_tf/_compat.py's inventory")

    def test_every_listed_private_name_is_checked_here(self):
        listed = {n for n in re.findall(r"(?<![\w])_[A-Za-z]\w*", _inventory()) if _private(n)}
        self.assertIn("_get_variable_index", listed)
        self.assertIn("_reduction_axes", listed)
        source = open(__file__).read()
        for name in sorted(listed):
            self.assertRegex(source, rf"\b{name}\b", f"smdist_tf/_compat.py lists {name}; check it in this file")

    def test_no_silent_fallback_on_an_internal_name(self):
        """``getattr(obj, "_name", default)`` or ``hasattr(obj, "_name")`` would hide a name an upgrade moved."""
        import ast

        # Deliberate switches, each documented where it is made.
        switches = {
            ("smdist_tf/_compat.py", "_should_call_train_batch_hooks"),  # Keras 2's CallbackList has it, Keras 3's not
            ("smdist_tf/testing/test_case.py", "_testMethodName"),  # unittest's _ErrorHolder (setUpClass) has none
        }
        internal = {"experimental_acd_manager"}  # TF internals without an underscore
        fallbacks = []
        for path in sorted((ROOT / "smdist_tf").rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and (node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3))
                        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                    name, where = node.args[1].value, str(path.relative_to(ROOT))
                    if (_private(name) or name in internal) and (where, name) not in switches:
                        fallbacks.append(f"{where}:{node.lineno}: {node.func.id}(..., {name!r})")
        self.assertEqual(fallbacks, [], "read TF/Keras internals directly, so a moved one raises")

    def test_overrides_match_the_base_method_and_nothing_is_overridden_unknowingly(self):
        for cls, base, base_instance, overridden, written in _overrides():
            with self.subTest(cls=cls.__qualname__):
                own = {n for k in _own_classes(cls, base) for n in vars(k) if _private(n)}
                self.assertEqual({n for n in own if hasattr(base, n)}, overridden,
                                 f"{cls.__qualname__}: private members that override {base.__qualname__}'s")
                for name in sorted(overridden):
                    ours, theirs = inspect.getattr_static(cls, name), inspect.getattr_static(base, name)
                    self.assertEqual(type(ours), type(theirs), f"{base.__qualname__}.{name}: method or property?")
                    self.assertEqual(_params(ours), _params(theirs), f"{base.__qualname__}.{name}'s arguments")
                    self.assertTrue(_listed(name), f"{cls.__qualname__} overrides {name}: list it in _compat.py")
                # Attributes smdist_tf sets on itself must not be the TF/Keras object's own (unless meant to).
                assigned = _assigned_private_attributes(cls, base)
                self.assertLessEqual(written, assigned)
                clashing = {n for n in assigned - written
                            if hasattr(base, n) or (base_instance is not None and n in vars(base_instance))}
                self.assertEqual(clashing, set(), f"{cls.__qualname__} sets {base.__qualname__}'s private attributes")
                for name in written:
                    self.assertTrue(_listed(name), f"{cls.__qualname__} sets {name}: list it in _compat.py")

    def test_read_and_called_private_names_exist(self):
        # (owner, name, what it must be: a type the value is an instance of, or the arguments of a callable).
        extended = tf.distribute.MirroredStrategy(["/cpu:0"]).extended
        model = compiled()
        optimizer = keras.optimizers.SGD()
        optimizer.build([keras.Variable(np.zeros(2, np.float32))])
        variable = keras.Variable(np.zeros(2, np.float32))
        inputs = keras.Input((2,))
        functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        reads = [
            (tf.Graph(), "experimental_acd_manager", type(None)),
            (extended, "_cross_device_ops", tf.distribute.CrossDeviceOps),
            (extended, "_collective_ops", tf.distribute.CrossDeviceOps),
            (extended, "_container_strategy", []),
            (extended, "_input_workers_with_options", ["options"]),
            (_compat.DistributedVariable, "_get_replica", ["self", "replica_id"]),
            (tf.distribute.experimental.CommunicationOptions(), "bytes_per_pack", int),
            (model, "_loss_tracker", keras.metrics.Mean),
            (optimizer, "_trainable_variables", list),
            (optimizer, "_get_variable_index", ["variable"]),
            (keras.Sequential(), "_functional", type(None)),
            (functional, "_nodes_by_depth", dict),
            (keras.layers.Flatten(), "_call_has_training_arg", bool),
            (keras.layers.Layer, "_flatten_layers", ["self", "include_self", "recursive"]),
            (keras.layers.Layer, "_get_own_losses", ["self"]),
            (keras.layers.BatchNormalization, "_moments", ["self", "inputs", "mask"]),
            (variable, "_value", tf.Variable),
            (variable.value, "_unique_id", str),  # ShardedParameter._unique_id reads its piece's
            (variable, "_initializer", type(None)),
            (variable, "_dtype", str),
            (keras.Variable, "_deferred_initialize", ["self"]),
            (keras.Variable, "_initialize", ["self", "value"]),
            (_compat.H5IOStore, "get", ["self", "path"]),
            (_compat.H5IOStore, "make", ["self", "path", "metadata"]),
            (_compat.H5IOStore, "close", ["self"]),
            (_compat.H5IOStore, "__getitem__", ["self", "key"]),
            (_compat.H5IOStore, "__setitem__", ["self", "key", "value"]),
            (_compat.H5IOStore, "__contains__", ["self", "item"]),
            (_compat.H5IOStore, "__bool__", ["self"]),
            (keras.callbacks.ModelCheckpoint, "_save_model", ["self", "epoch", "batch", "logs"]),
            (tf.test.TestCase("run"), "_testMethodName", str),
        ]
        for owner, name, expected in reads:
            with self.subTest(owner=owner, name=name):
                value = getattr(owner, name)  # AttributeError: TF or Keras moved it
                if isinstance(expected, list):
                    self.assertTrue(callable(value))
                    self.assertEqual(_params(value), expected)
                else:
                    self.assertIsInstance(value, expected)
                self.assertTrue(name == "bytes_per_pack" or name.startswith("__") or _listed(name),
                                f"{name} is missing from smdist_tf/_compat.py's inventory")

    def test_collectives_run_independently_of_program_order_while_tracing(self):
        from smdist_tf.collectives import _unordered

        marked = []

        @tf.function
        def step():
            manager = tf.constant(0).graph.experimental_acd_manager
            self.assertIsNotNone(manager, "tf.function no longer traces under an AutomaticControlDependencies")
            value = tf.random.uniform([2])  # a stateful op, as a collective is
            _unordered(value)
            marked.append(value.op.get_attr("_independent_side_effects"))
            return value

        step()
        self.assertEqual(marked, [True])
        with tf.Graph().as_default():  # a tf.compat.v1 graph: no manager, nothing to do
            value = tf.random.uniform([2])
            self.assertIs(_unordered(value), value)
            with self.assertRaises(ValueError):
                value.op.get_attr("_independent_side_effects")

    def test_strategy_internals_behave_as_relied_on(self):
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        self.assertIs(strategy.extended._container_strategy(), strategy)
        # tf.distribute.Strategy.cluster_resolver reads the extended's _cluster_resolver (set to None by ours).
        resolver = object()
        strategy.extended._cluster_resolver = resolver
        self.assertIs(tf.distribute.Strategy.cluster_resolver.fget(strategy), resolver)
        # The base class gathers through _gather_implementation unless _num_between_graph_workers is 1.
        gathered = []

        class Gathering(tf.distribute.ReductionToOneDevice):
            @property
            def _num_between_graph_workers(self):
                return 2

            def _gather_implementation(self, per_replica_value, destinations, axis, options):
                gathered.append(axis)
                return per_replica_value

        with strategy.scope():
            Gathering()._gather(tf.constant([1.0]), "/cpu:0", axis=0)  # what Strategy.gather calls
        self.assertEqual(gathered, [0])
        from smdist_tf.distribute.cross_device_ops import _bytes_per_pack

        self.assertEqual(_bytes_per_pack(tf.distribute.experimental.CommunicationOptions(bytes_per_pack=7)), 7)
        self.assertEqual(_bytes_per_pack(None), 0)

    def test_keras_internals_behave_as_relied_on(self):
        model = compiled()
        model._loss_tracker.update_state(3.0)  # PipelineModel's loss: what fit logs as "loss"
        self.assertAllClose(model.get_metrics_result()["loss"], 3.0)
        optimizer = keras.optimizers.SGD()
        first, second = keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros(3, np.float32))
        optimizer.build([first, second])
        self.assertEqual(optimizer._get_variable_index(second), 1)
        self.assertEqual([id(v) for v in optimizer._trainable_variables], [id(first), id(second)])
        self.assertIsInstance(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])._functional,
                              _compat.Functional)
        self.assertTrue(keras.layers.Dropout(0.5)._call_has_training_arg)
        self.assertFalse(keras.layers.Flatten()._call_has_training_arg)
        # Keras 3's CallbackList has no _should_call_train_batch_hooks: append_callback's Keras 2 switch.
        self.assertFalse(hasattr(keras.callbacks.CallbackList([]), "_should_call_train_batch_hooks"))

    def test_the_pipeline_walks_and_runs_a_functional_graph_as_keras_does(self):
        from smdist_tf.pipeline.graph import ModelGraph

        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(3, activity_regularizer="l2")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dropout(0.5)(hidden)))
        graph = ModelGraph(model)
        self.assertEqual([type(c.layer).__name__ for c in graph.calls], ["Dense", "Dropout", "Dense"])
        (outputs,), losses = graph.run(graph.calls, graph.input_ids, [X], graph.output_ids, training=False)
        self.assertAllClose(outputs, model(X, training=False))
        self.assertLen(losses, 1)  # the activity regularizer's, through _get_own_losses
        with self.assertRaisesRegex(ValueError, "must start with keras.Input"):
            ModelGraph(keras.Sequential([keras.layers.Dense(1)]))

    def test_offload_activations_sees_a_loss_added_deep_inside_a_block(self):
        # _flatten_layers reaches the nested layer, _get_own_losses reports what its call added.
        class AddsLoss(keras.layers.Layer):
            def call(self, x):
                self.add_loss(tf.reduce_sum(x))
                return x

        block = keras.Sequential([keras.layers.Dense(2), AddsLoss()])
        with self.assertRaisesRegex(ValueError, "adds losses in its call"):
            sk.OffloadActivations(block)(X)

    def test_h5_store_reads_what_keras_wrote(self):
        from smdist_tf.pipeline.weights import checkpoint_layout

        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        path = os.path.join(tempfile.mkdtemp(), "m.weights.h5")
        model.save_weights(path)
        layout = checkpoint_layout(model)  # _RecordingStore through _compat.save_state
        entry = next(e for e in layout if e.items)
        key, variable = entry.items[0]
        store = _compat.H5IOStore(path, mode="r")
        try:
            store.get(entry.path)
            self.assertIn(key, store)
            self.assertEqual(tuple(store._h5_entry_group[key].shape), tuple(variable.shape))
            self.assertAllClose(store[key], variable.numpy())
        finally:
            store.close()


class KerasDistributionReachesTest(tf.test.TestCase):
    """keras.distribution on TensorFlow (smdist_tf/keras/distribution_*.py): what Keras calls, and where."""

    def test_keras_calls_exactly_the_backend_functions_smdist_tf_sets(self):
        import importlib.util

        from smdist_tf.keras import distribution_backend

        frontend = sys.modules[keras.distribution.initialize.__module__]
        backend_module = _compat.keras_backend_distribution_lib()
        self.assertIs(frontend.distribution_lib, backend_module)  # the module Keras dispatches to
        called = set(re.findall(r"\bdistribution_lib\.(\w+)\(", inspect.getsource(frontend)))
        self.assertEqual(called, {"initialize", "list_devices", "get_device_count", "num_processes", "process_id",
                                  "distribute_tensor", "_to_backend_mesh", "_to_backend_layout"})
        # Distribution.__init__ asks the backend for processes only when it has both functions.
        self.assertIn('hasattr(distribution_lib, "num_processes")', inspect.getsource(frontend.Distribution.__init__))
        ours = {f.__name__: f for f in distribution_backend._FUNCTIONS}
        self.assertLessEqual(called, set(ours))
        # JAX's trainer calls distribute_data_input too: ours take the same arguments as JAX's module.
        import ast

        jax_source = open(importlib.util.find_spec("keras.src.backend.jax.distribution_lib").origin).read()
        jax_params = {node.name: [a.arg for a in node.args.args] for node in ast.parse(jax_source).body
                      if isinstance(node, ast.FunctionDef)}
        for name, function in ours.items():
            self.assertEqual(_params(function), jax_params[name], name)

    def test_set_distribution_and_scope_store_through_set_global_attribute(self):
        source = inspect.getsource(sys.modules[keras.distribution.set_distribution.__module__].set_distribution)
        self.assertIn("global_state.set_global_attribute(GLOBAL_ATTRIBUTE_NAME, value)", source)
        self.assertIn("set_distribution(self)", inspect.getsource(keras.distribution.DataParallel.scope))
        self.assertTrue(callable(_compat.keras_global_state().set_global_attribute))
        mesh = keras.distribution.DeviceMesh((1,), ["batch"], ["cpu:0"])
        layout_map = keras.distribution.LayoutMap(mesh)
        distribution = keras.distribution.ModelParallel(layout_map=layout_map)
        self.assertIs(distribution._layout_map, layout_map)
        with distribution.scope():
            attribute = _compat.keras_distribution_attribute()
            self.assertIs(_compat.get_global_attribute(attribute), distribution)
        self.assertIsNone(keras.distribution.distribution())

    def test_a_current_distribution_sets_the_job_strategy_in_one_process(self):
        self.assertTrue(sk.use_keras_distribution())
        from smdist_tf.keras.distribution_activation import job_strategy
        from smdist_tf.keras.patches import KERAS_DISTRIBUTION_PATCHES, installed_patches

        self.assertLessEqual({p.target for p in KERAS_DISTRIBUTION_PATCHES}, set(installed_patches()))

        self.assertFalse(tf.distribute.has_strategy())
        with keras.distribution.DataParallel().scope():
            self.assertIs(tf.distribute.get_strategy(), job_strategy())
            self.assertEqual(keras.distribution.list_devices(), ["cpu:0"])
        self.assertFalse(tf.distribute.has_strategy())
        # clear_session() resets TensorFlow's default graph, which drops the global strategy with Keras' state.
        keras.distribution.set_distribution(keras.distribution.DataParallel())
        keras.utils.clear_session()
        self.assertFalse(tf.distribute.has_strategy())
        self.assertIsNone(keras.distribution.distribution())
        keras.distribution.set_distribution(keras.distribution.DataParallel())
        self.assertIs(tf.distribute.get_strategy(), job_strategy())
        keras.distribution.set_distribution(None)
        self.assertFalse(tf.distribute.has_strategy())


class PatchTargetsTest(tf.test.TestCase):
    """Each global patch of smdist_tf/keras/patches.py wraps a method Keras still calls on the path it patches.

    A patch Keras stopped calling would change nothing, and say nothing: one rank's overflow or a sharded
    optimizer would then fail only in a multi-rank job. Each check calls Keras' own public entry point.
    """

    def test_every_patch_has_a_check_here(self):
        from smdist_tf.keras.patches import PATCHES

        checks = {  # each patch's installer: the test of its target
            "patch_training_loops": (KerasReachesTest, "test_loop_end_comes_after_the_last_step_and_before_"
                                                       "validation_and_epoch_end"),
            "patch_check_finite": (PatchTargetsTest, "test_loss_scale_optimizer_decides_finiteness_through_check_finite"),
            "patch_predict_on_batch": (PatchTargetsTest, "test_predict_on_batch_is_the_method_users_call_with_x"),
            "patch_optimizer_creation": (PatchTargetsTest, "test_every_keras_optimizer_is_made_through_optimizer_init"),
            "patch_gradient_reduction": (InternalReachesTest, "test_keras_reduces_an_optimizers_gradients_in_one_call_"
                                                              "adasum_replaces"),
            "patch_layer_call": (PatchTargetsTest, "test_the_layers_parameter_sharding_gathers_for_are_called_through_"
                                                   "layer_call"),
        }
        for test_class, name in checks.values():
            self.assertTrue(callable(getattr(test_class, name)), name)
        self.assertEqual(sorted(p.install.__name__ for p in PATCHES), sorted(checks),
                         "a patch in smdist_tf/keras/patches.py without a check of its target here")

    def test_loss_scale_optimizer_decides_finiteness_through_check_finite(self):
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=2.0)
        variable = keras.Variable(np.ones(2, np.float32))
        optimizer.build([variable])
        seen = []
        keras_check = optimizer.check_finite

        def recording(grads):
            seen.append(len(grads))
            return keras_check(grads)

        optimizer.check_finite = recording  # apply calls it on the optimizer
        optimizer.apply([tf.constant([np.inf, 1.0])], [variable])
        self.assertEqual(seen, [1])
        self.assertAllEqual(variable.numpy(), [1.0, 1.0])  # skipped as not finite
        self.assertAllClose(optimizer.dynamic_scale.numpy(), 1.0)  # and the scale halved

    def test_predict_on_batch_is_the_method_users_call_with_x(self):
        self.assertEqual(list(inspect.signature(keras.Model.predict_on_batch).parameters), ["self", "x"])
        self.assertEqual(list(inspect.signature(keras.Model.predict_step).parameters), ["self", "data"])
        model = compiled()
        self.assertEqual(model.predict_on_batch(X[:3]).shape, (3, 2))
        for attribute in ("distribute_strategy", "run_eagerly", "jit_compile"):
            getattr(model, attribute)  # what the patched method reads; raises if gone

    def test_every_keras_optimizer_is_made_through_optimizer_init(self):
        made = []
        patched = keras.optimizers.Optimizer.__init__

        def recording(optimizer, *args, **kwargs):
            made.append(type(optimizer))
            patched(optimizer, *args, **kwargs)

        classes = [cls for cls in vars(keras.optimizers).values() if isinstance(cls, type)
                   and issubclass(cls, keras.optimizers.Optimizer) and cls not in (
                       keras.optimizers.Optimizer, keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)]
        self.assertIn(keras.optimizers.Adam, classes)
        keras.optimizers.Optimizer.__init__ = recording
        try:
            for cls in classes:
                cls()
        finally:
            keras.optimizers.Optimizer.__init__ = patched
        self.assertEqual(made, classes)

    def test_the_layers_parameter_sharding_gathers_for_are_called_through_layer_call(self):
        layer_call = inspect.getattr_static(keras.layers.Layer, "__call__")
        for cls in (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Conv1D, keras.layers.Conv2D,
                    keras.layers.Embedding, keras.layers.BatchNormalization, keras.layers.LayerNormalization,
                    keras.Model, keras.Sequential):
            self.assertIs(inspect.getattr_static(cls, "__call__"), layer_call, f"{cls.__name__} has its own __call__")
        called = []
        keras_call = keras.layers.Layer.__call__

        def recording(layer, *args, **kwargs):
            called.append(type(layer).__name__)
            return keras_call(layer, *args, **kwargs)

        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
        keras.layers.Layer.__call__ = recording
        try:
            model(X[:2])
        finally:
            keras.layers.Layer.__call__ = keras_call
        self.assertEqual(called, ["Sequential", "Dense", "Dense"])  # a model calls its layers through it
