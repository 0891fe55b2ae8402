"""Keras 3's ``keras.distribution`` on the TensorFlow backend, served by smdist_tf.

Run on every rank by tests/test_keras_multiprocess.py, in the jobs of suite_keras.py. A script written the
JAX way (``DataParallel`` + ``fit``) must train exactly as ``DataParallelStrategy`` does at
the same global batch; devices, ``initialize``'s arguments, scopes and the errors of what
is not served are checked on every rank, together.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import unittest

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk
from smdist_tf import _compat
from tests.mp.rank_counts import at_two_ranks_only
from tests.mp.sync_assertions import SyncAssertions
from tests.mpi_harness import ROOT

RANK, SIZE = sd.rank(), sd.size()
HANG_S = 150
assert sk.use_keras_distribution()
from smdist_tf.keras.distribution_activation import job_strategy  # noqa: E402  (made by the call above)

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
BATCH = 16  # global
rng = np.random.default_rng(0)
X = rng.normal(size=(96, 6)).astype(np.float32)  # 6 global batches: each splits evenly at 2 and 4 ranks
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1).astype(np.int64)


def dataset(x: np.ndarray = X, y: np.ndarray = Y) -> tf.data.Dataset:
    """The whole data on every rank, in global batches."""
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def compiled_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss=LOSS)
    return model


def flat_weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w, np.float64).ravel() for w in model.get_weights()])


def reference_run(epochs: int = 2) -> tuple[list, np.ndarray]:
    """The same training with DataParallelStrategy, no keras.distribution: (epoch losses, final weights)."""
    strategy = sd.DataParallelStrategy()
    with strategy.scope():
        model = compiled_model()
    history = model.fit(dataset(), epochs=epochs, verbose=0)
    return history.history["loss"], flat_weights(model)


REFERENCE_LOSSES, REFERENCE_WEIGHTS = reference_run()


class DevicesAndInitializeTest(SyncAssertions):
    def test_list_devices_is_one_device_per_rank(self):
        self.assertEqual(keras.distribution.list_devices(), [f"cpu:{r}" for r in range(SIZE)])
        self.assertEqual(keras.distribution.list_devices("cpu"), [f"cpu:{r}" for r in range(SIZE)])
        self.assertEqual(keras.distribution.list_devices("gpu"), [])  # this machine has none
        self.assertEqual(keras.distribution.get_device_count(), SIZE)
        distribution = keras.distribution.DataParallel()
        self.assertEqual(distribution.num_processes, SIZE)
        self.assertEqual(distribution.device_mesh.shape, (SIZE,))
        self.assertEqual(distribution.data_shard_id, RANK)
        self.assertIs(distribution.device_mesh.backend_mesh, job_strategy())
        self.assertEqual(job_strategy().num_replicas_in_sync, SIZE)
        # What JAX's trainer calls for each batch: this rank's batch is its replica's, as it is.
        batch = tf.ones([4, 6])
        backend = _compat.keras_backend_distribution_lib()
        self.assertIs(backend.distribute_data_input(batch, distribution.get_data_layout([4, 6]), "batch"), batch)

    def test_initialize_accepts_the_jobs_own_values(self):
        keras.distribution.initialize()
        keras.distribution.initialize(num_processes=SIZE, process_id=RANK)
        keras.distribution.initialize(job_addresses=",".join(f"host{r}:1234" for r in range(SIZE)))
        keras.distribution.initialize(job_addresses="coordinator:1234")  # JAX's spelling: one address
        self.assertTrue(sd.is_initialized())
        self.assert_engine_healthy()

    def test_initialize_refuses_another_job_on_every_rank(self):
        with self.assertRaisesRegex(ValueError, rf"num_processes={SIZE + 1} but smdist_tf has {SIZE}.*-np"):
            keras.distribution.initialize(num_processes=SIZE + 1)
        with self.assertRaisesRegex(ValueError, rf"process_id={(RANK + 1) % SIZE} but smdist_tf has {RANK}"):
            keras.distribution.initialize(process_id=(RANK + 1) % SIZE)
        with self.assertRaisesRegex(ValueError, r"job_addresses \(count\)=3"):
            keras.distribution.initialize(job_addresses="a:1,b:2,c:3" if SIZE != 3 else "a:1,b:2")
        self.assert_engine_healthy()


class DataParallelTrainingTest(SyncAssertions):
    def test_the_jax_way_trains_as_the_strategy_does_at_the_same_global_batch(self):
        keras.distribution.set_distribution(keras.distribution.DataParallel())
        try:
            self.assertIs(tf.distribute.get_strategy(), job_strategy())
            model = compiled_model()
            history = model.fit(dataset(), epochs=2, verbose=0)
        finally:
            keras.distribution.set_distribution(None)
        self.assertFalse(tf.distribute.has_strategy())
        weights = flat_weights(model)
        self.assert_identical_on_all_ranks(weights)
        self.assertAllClose(history.history["loss"], REFERENCE_LOSSES, atol=1e-5, rtol=1e-5)
        self.assertAllClose(weights, REFERENCE_WEIGHTS, atol=1e-5, rtol=1e-5)

    @at_two_ranks_only("the scope's routing of fit, evaluate, predict and checkpoints is the same at any rank count")
    def test_a_scope_serves_fit_evaluate_predict_and_checkpoints(self):
        path = os.path.join(sd.broadcast_object(tempfile.mkdtemp() if RANK == 0 else None), "last.weights.h5")
        with keras.distribution.DataParallel().scope():
            self.assertIs(tf.distribute.get_strategy(), job_strategy())
            model = compiled_model()
            checkpoint = sk.callbacks.ModelCheckpoint(path, save_weights_only=True)  # files from rank 0 only
            model.fit(dataset(), epochs=1, verbose=0, callbacks=[checkpoint])
            loss = model.evaluate(dataset(), verbose=0)
        self.assertFalse(tf.distribute.has_strategy())
        self.assertIsNone(keras.distribution.distribution())
        self.assert_identical_on_all_ranks(flat_weights(model))
        # Every rank computed its share; the results are the whole data's.
        local = model(X, training=False)
        self.assertAllClose(loss, float(LOSS(Y, local)), atol=1e-5, rtol=1e-5)
        # Outside the scope the model keeps its strategy, which shards global batches by rank itself.
        predictions = model.predict(dataset(), verbose=0)
        self.assertAllClose(predictions, local, atol=1e-5, rtol=1e-5)
        sd.barrier()  # rank 0's file is written
        restored = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
        restored.load_weights(path)
        self.assertAllClose(flat_weights(restored), flat_weights(model), atol=0, rtol=0)

    def test_uneven_shares_end_together(self):
        # 100 samples: Keras gives the last global batch of 4 to rank 0 alone (rank 1 at 2 ranks).
        with keras.distribution.DataParallel().scope():
            model = compiled_model()
            history = model.fit(dataset(np.concatenate([X, X[:4]]), np.concatenate([Y, Y[:4]])), epochs=1, verbose=0)
        self.assertEqual(len(history.history["loss"]), 1)
        self.assert_identical_on_all_ranks(flat_weights(model))
        self.assert_engine_healthy()

    def test_nested_scopes_and_set_distribution_keep_the_strategy_set_while_one_is_current(self):
        outer, inner = keras.distribution.DataParallel(), keras.distribution.DataParallel()
        keras.distribution.set_distribution(outer)
        try:
            with inner.scope():
                self.assertIs(keras.distribution.distribution(), inner)
                self.assertIs(tf.distribute.get_strategy(), job_strategy())
            self.assertIs(keras.distribution.distribution(), outer)
            self.assertIs(tf.distribute.get_strategy(), job_strategy())
        finally:
            keras.distribution.set_distribution(None)
        self.assertFalse(tf.distribute.has_strategy())

    @at_two_ranks_only("how NumPy input is split is the same rule at any rank count")
    def test_numpy_input_needs_auto_shard_off_as_on_jax(self):
        with keras.distribution.DataParallel().scope():
            model = compiled_model()
            with self.assertRaisesRegex(ValueError, "must be provided as a `tf.data.Dataset`"):
                model.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0)
        # Without auto-sharding each rank passes its own share, in per-rank batches, used as it is:
        # here the share of every global batch Keras would have given this rank.
        share = BATCH // SIZE
        mine = np.concatenate([np.arange(start + RANK * share, start + (RANK + 1) * share)
                               for start in range(0, len(X), BATCH)])
        with keras.distribution.DataParallel(auto_shard_dataset=False).scope():
            model = compiled_model()
            history = model.fit(X[mine], Y[mine], batch_size=share, epochs=2, shuffle=False, verbose=0)
        self.assertAllClose(history.history["loss"], REFERENCE_LOSSES, atol=1e-5, rtol=1e-5)
        self.assert_identical_on_all_ranks(flat_weights(model))


def _model_parallel(layouts: dict) -> keras.distribution.ModelParallel:
    shape = (SIZE // 2, 2)  # at 2 ranks one model replica: every rank gets the whole batch
    mesh = keras.distribution.DeviceMesh(shape, ["batch", "model"], keras.distribution.list_devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in layouts.items():
        layout_map[key] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


class ModelParallelTest(SyncAssertions):
    def test_replicating_layouts_train_as_data_parallel(self):
        distribution = _model_parallel({".*kernel": (None, None), ".*bias": (None,),
                                        ".*dense.*/output": ("batch", None)})
        with distribution.scope():
            model = compiled_model()
            history = model.fit(dataset(), epochs=2, verbose=0)
        self.assert_identical_on_all_ranks(flat_weights(model))
        self.assertAllClose(history.history["loss"], REFERENCE_LOSSES, atol=1e-5, rtol=1e-5)

    def test_a_layout_sharding_weights_raises_naming_it_on_every_rank(self):
        distribution = _model_parallel({".*kernel": (None, "model")})
        with self.assertRaisesRegex(NotImplementedError, r"'\.\*kernel'.*dimension 1 over the mesh axis 'model'"):
            keras.distribution.set_distribution(distribution)
        with self.assertRaisesRegex(NotImplementedError, r"'\.\*kernel'"):
            with distribution.scope():
                pass
        self.assertIsNone(keras.distribution.distribution())
        self.assertFalse(tf.distribute.has_strategy())
        layout = keras.distribution.TensorLayout((None, "batch"), keras.distribution.DataParallel().device_mesh)
        with self.assertRaisesRegex(NotImplementedError, "dimension 1 over the mesh axis 'batch'"):
            keras.distribution.distribute_tensor(tf.ones([2, 2]), layout)
        self.assert_engine_healthy()


class ExampleTest(SyncAssertions):
    @unittest.skipIf(SIZE != 2, "once is enough (the digits take a while at 4 ranks on 2 cores)")
    def test_the_example_trains(self):
        spec = importlib.util.spec_from_file_location("keras_distribution_example",
                                                      ROOT / "examples" / "keras_distribution.py")
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        result = example.main(["--epochs", "2", "--batch-size", "128"])
        losses = result["history"]["loss"]
        self.assertLess(losses[-1], losses[0])
        self.assertGreater(result["accuracy"], 0.5)  # 2 short epochs; chance is 0.1
        self.assert_identical_on_all_ranks(flat_weights(result["model"]))
        self.assertFalse(tf.distribute.has_strategy())
