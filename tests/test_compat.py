"""The Keras internals smdist_tf/_compat.py reaches into still behave as it relies on.

Single process. A Keras upgrade that moves one of these fails here, by name, instead of
letting uneven data hang a multi-rank job.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
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
        self.assertEqual([tuple(a.shape) for a in optimizer._accumulated_gradients], [(3,)])
        self.assertEqual(int(optimizer._iterations.numpy()), 0)

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
