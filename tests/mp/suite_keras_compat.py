"""``smdist_tf.keras`` as a drop-in for ``horovod.tensorflow.keras``: every name, checked against local values.

Run on every rank by tests/test_keras_compat_multiprocess.py. Every test runs on every
rank in the same order, so eager collectives pair up across ranks. Expected values
come from NumPy on gathered inputs (``allgather_object``), not from the code under test.
"""

from __future__ import annotations

import os
import warnings

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as hvd
import smdist_tf.keras.callbacks as callbacks_module
from smdist_tf.pipeline.model import PipelineModel

RANK, SIZE = sd.rank(), sd.size()


def everyone(value):
    """``value`` of every rank, in rank order (through pickles, not the collectives under test)."""
    return sd.allgather_object(value)


def mlp(seed: int, built: bool = True) -> keras.Model:
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(5, activation="tanh", name="first"), keras.layers.Dense(2, name="second")]
    return keras.Sequential(([keras.Input((4,))] if built else []) + layers)


def batch(seed: int, n: int = 8):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32)


def local_gradients(model: keras.Model, x, y) -> list[np.ndarray]:
    """This rank's gradients of the compiled loss ("mse") for one batch."""
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def shared_dir(test: tf.test.TestCase) -> str:
    return sd.broadcast_object(test.get_temp_dir() if RANK == 0 else None)


class CompatTest(tf.test.TestCase):
    def assert_identical_on_all_ranks(self, values: np.ndarray) -> None:
        for r, theirs in enumerate(everyone(values)):
            self.assertAllEqual(theirs, values, msg=f"rank {r} differs from rank {RANK}")


class NamesTest(CompatTest):
    def test_runtime_names_are_smdist_tfs_own(self):
        for name in ("init", "shutdown", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
                     "is_initialized", "mpi_built", "nccl_built", "gloo_built", "cuda_built", "mpi_threads_supported",
                     "start_timeline", "stop_timeline", "mpi_enabled", "gloo_enabled", "ddl_built", "ccl_built",
                     "rocm_built", "Compression", "Average", "Sum", "allgather_object", "broadcast_object"):
            self.assertIs(getattr(hvd, name), getattr(sd, name), name)
        self.assertEqual((hvd.rank(), hvd.size()), (RANK, SIZE))
        self.assertEqual(everyone(hvd.local_rank()), list(range(SIZE)))  # one host
        self.assertEqual((hvd.local_size(), hvd.cross_rank(), hvd.cross_size()), (SIZE, 0, 1))
        self.assertTrue(hvd.is_initialized() and hvd.mpi_built())
        self.assertFalse(hvd.gloo_built())
        # NCCL and the CUDA runtime load at run time: whether they load here (tests/test_single_process.py).
        self.assertIsInstance(hvd.nccl_built(), int)  # NCCL's version code or 0, as Horovod's
        self.assertIsInstance(hvd.cuda_built(), bool)
        self.assertIs(hvd.PipelineModel, PipelineModel)
        self.assertIs(hvd.callbacks, callbacks_module)
        for name in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
                     "LearningRateWarmupCallback", "BestModelCheckpoint"):
            self.assertTrue(issubclass(getattr(hvd.callbacks, name), keras.callbacks.Callback), name)
        self.assertIs(hvd.elastic.run, sd.elastic.run)
        self.assertIs(hvd.elastic.CommitStateCallback, sd.elastic.CommitStateCallback)
        with self.assertRaisesRegex(AttributeError, "no attribute 'nonexistent'"):
            hvd.nonexistent  # noqa: B018

    def test_elastic_keras_state_syncs_rank_zero(self):
        model = mlp(seed=40 + RANK)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        state = hvd.elastic.KerasState(model, epoch=3 + RANK)
        state.sync()
        self.assertEqual(state.epoch, 3)
        self.assertAllEqual(flat(model.get_weights()), flat(mlp(seed=40).get_weights()))


class CollectivesTest(CompatTest):
    def test_allreduce_takes_values_and_returns_the_result(self):
        value = np.array([1.0, 2.0]) * (RANK + 1)  # float64 NumPy
        everyones = np.array(everyone(value))
        result = hvd.allreduce(value)
        self.assertIsInstance(result, tf.Tensor)
        self.assertEqual(result.dtype, tf.float64)
        self.assertAllClose(result, everyones.mean(axis=0))
        self.assertAllClose(hvd.allreduce(value, name="compat.sum", op=hvd.Sum), everyones.sum(axis=0))
        self.assertAllClose(hvd.allreduce([float(RANK)], op=sd.Max), [SIZE - 1.0])
        self.assertAllClose(hvd.allreduce(value, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
                            everyones.sum(axis=0) * 0.5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertAllClose(hvd.allreduce(value, average=False), everyones.sum(axis=0))
        self.assertTrue(any(issubclass(w.category, DeprecationWarning) for w in caught))
        third = np.float32(1 / 3) * (RANK + 1)
        half = hvd.allreduce(np.full([4], third, np.float32), compression=hvd.Compression.fp16)
        self.assertEqual(half.dtype, tf.float32)
        self.assertAllClose(half, np.full([4], np.mean(everyone(third))), rtol=1e-3)

        @tf.function
        def in_graph(x):
            return hvd.allreduce(x, op=hvd.Sum)

        self.assertAllClose(in_graph(tf.constant(value)), everyones.sum(axis=0))

    def test_grouped_allreduce(self):
        values = [np.float32(RANK), np.arange(3, dtype=np.int32) * RANK]
        summed = hvd.grouped_allreduce(values, op=hvd.Sum, name="compat.grouped")
        self.assertEqual(len(summed), 2)
        self.assertAllClose(summed[0], sum(range(SIZE)))
        self.assertAllEqual(summed[1], np.arange(3) * sum(range(SIZE)))
        self.assertEqual(summed[1].dtype, tf.int32)
        averaged = hvd.grouped_allreduce([[1.0 * RANK, 2.0]])
        self.assertAllClose(averaged[0], [(SIZE - 1) / 2, 2.0])

    def test_allgather_broadcast_reducescatter_alltoall(self):
        self.assertAllEqual(hvd.allgather(np.full([RANK + 1, 2], RANK)),
                            np.concatenate([np.full([r + 1, 2], r) for r in range(SIZE)]))
        self.assertAllEqual(hvd.allgather(RANK * 1.5, name="compat.gather"), [r * 1.5 for r in range(SIZE)])

        self.assertAllEqual(hvd.broadcast(np.arange(3) + 10 * RANK, SIZE - 1), np.arange(3) + 10 * (SIZE - 1))
        self.assertEqual(int(hvd.broadcast(RANK + 7, 0, name="compat.bcast")), 7)

        rows = np.arange(2 * SIZE * 3, dtype=np.float32).reshape(2 * SIZE, 3) * (RANK + 1)
        total = np.sum(everyone(rows), axis=0)
        self.assertAllClose(hvd.reducescatter(rows), (total / SIZE)[2 * RANK:2 * RANK + 2])
        self.assertAllClose(hvd.reducescatter(rows, name="compat.rs", op=hvd.Sum), total[2 * RANK:2 * RANK + 2])

        sent = np.arange(SIZE) + 100 * RANK
        self.assertAllEqual(hvd.alltoall(sent), [100 * r + RANK for r in range(SIZE)])
        splits = [d + 1 for d in range(SIZE)]  # d + 1 rows to rank d
        rows_out = np.arange(sum(splits)) + 1000 * RANK
        received, received_splits = hvd.alltoall(rows_out, splits=splits, name="compat.a2a")
        start = sum(splits[:RANK])
        self.assertAllEqual(received, np.concatenate(
            [np.arange(start, start + RANK + 1) + 1000 * r for r in range(SIZE)]))
        self.assertAllEqual(received_splits, [RANK + 1] * SIZE)

    def test_broadcast_global_variables_takes_model_and_optimizer_state(self):
        model = mlp(seed=50 + RANK)
        model.compile(optimizer=keras.optimizers.Adam(0.01 * (RANK + 1)), loss="mse")
        model.train_on_batch(*batch(seed=RANK))  # rank-specific weights, slots, learning rate
        state = lambda: flat([v.numpy() for v in model.variables + model.optimizer.variables])  # noqa: E731
        root = everyone(state())[SIZE - 1]
        self.assertIsNone(hvd.broadcast_global_variables(SIZE - 1, model))
        for r, theirs in enumerate(everyone(state())):
            self.assertAllEqual(theirs, root, msg=f"rank {r} did not take rank {SIZE - 1}'s state")
        self.assertAllClose(model.optimizer.learning_rate.numpy(), 0.01 * SIZE)
        with self.assertRaisesRegex(ValueError, "no global variables: pass the model"):
            hvd.broadcast_global_variables(0)
        with self.assertRaisesRegex(ValueError, "not built"):
            hvd.broadcast_global_variables(0, mlp(seed=1, built=False))


class HorovodKerasNamesTest(CompatTest):
    """Horovod's spellings that scripts and Horovod's own tests use (issue 40 item 2)."""

    lr = 0.5

    def test_broadcast_callback_keeps_local_variables(self):
        model = mlp(seed=70 + RANK)  # different weights on every rank
        kernel = model.get_layer("first").kernel
        callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0, device="", local_variables=kernel)
        callback.set_model(model)
        mine = kernel.numpy()
        callback.on_train_begin()
        self.assertAllEqual(kernel.numpy(), mine)  # kept
        self.assert_identical_on_all_ranks(flat([model.get_layer("second").kernel.numpy()]))
        with self.assertRaisesRegex(ValueError, "every local variable must be"):
            hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=["first/kernel"])

    def test_metric_average_callback_takes_horovods_device_argument(self):
        logs = {"loss": float(RANK)}
        hvd.callbacks.MetricAverageCallback(device="").on_epoch_end(0, logs)
        self.assertAllClose(logs["loss"], (SIZE - 1) / 2)

    def test_compute_gradients_returns_reduced_pairs_that_apply_once(self):
        for op in (sd.Average, sd.Sum):
            model = mlp(seed=71)  # the same start on every rank
            optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(self.lr), op=op)
            x, y = batch(seed=300 + RANK)
            before = [v.numpy() for v in model.trainable_variables]
            reduce = np.mean if op == sd.Average else np.sum
            want = [reduce(g, axis=0) for g in zip(*everyone(local_gradients(model, x, y)))]

            def loss():
                return keras.losses.MeanSquaredError()(y, model(x, training=True))

            pairs = optimizer._compute_gradients(loss, model.trainable_variables)
            for (g, v), w, var in zip(pairs, want, model.trainable_variables):
                self.assertIs(v, var)
                self.assertAllClose(g, w, rtol=1e-5, atol=1e-6)
            optimizer.apply_gradients(pairs)  # not reduced a second time (op=Sum would show it)
            for v, b, w in zip(model.trainable_variables, before, want):
                self.assertAllClose(v.numpy(), b - self.lr * w, rtol=1e-5, atol=1e-6)
            with tf.GradientTape() as tape:  # a loss tensor with the tape that recorded it
                value = loss()
            pairs = optimizer._compute_gradients(value, model.trainable_variables, tape=tape)
            self.assertLen(pairs, len(model.trainable_variables))
            with self.assertRaisesRegex(ValueError, "needs the `tape`"):
                optimizer._compute_gradients(value, model.trainable_variables)

    def test_best_model_checkpoint_takes_horovods_save_weights_only(self):
        callback = hvd.callbacks.BestModelCheckpoint("loss", 0, True, "min")
        self.assertTrue(callback.save_weights_only)
        callback.filepath = os.path.join(shared_dir(self), "best.keras")
        callback.set_model(mlp(seed=72))
        with self.assertRaisesRegex(ValueError, "must end in .weights.h5"):
            callback.on_train_begin()


class PartialDistributedOptimizerTest(CompatTest):
    lr = 0.5

    def step(self, model: keras.Model, seed: int):
        """One train_on_batch on rank-specific data; returns (before, local grads, mean grads, after)."""
        x, y = batch(seed=seed + RANK)
        model(x)  # builds the layers: the optimizer looks their weights up only now
        before = [v.numpy() for v in model.trainable_variables]
        grads = local_gradients(model, x, y)
        mean = [np.mean(g, axis=0) for g in zip(*everyone(grads))]
        model.train_on_batch(x, y)
        return before, grads, mean, [v.numpy() for v in model.trainable_variables]

    def test_local_layers_keep_local_gradients_and_others_are_averaged(self):
        model = mlp(seed=60, built=False)  # the same start on every rank
        optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(self.lr),
                                                    local_layers=model.get_layer("first"))
        self.assertEqual(type(optimizer).__name__, "SGD")
        self.assertIsInstance(optimizer, keras.optimizers.SGD)
        model.compile(optimizer=optimizer, loss="mse")
        before, grads, mean, after = self.step(model, seed=100)
        # first/kernel, first/bias stay local, divided by size() as Horovod does; second/* are averaged.
        for i in (0, 1):
            self.assertAllClose(after[i], before[i] - self.lr * grads[i] / SIZE, rtol=1e-5, atol=1e-6)
        for i in (2, 3):
            self.assertAllClose(after[i], before[i] - self.lr * mean[i], rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(flat(after[2:]))
        if SIZE > 1:
            firsts = everyone(flat(after[:2]))
            self.assertNotAllClose(firsts[0], firsts[1])

    def test_register_local_var_without_scaling(self):
        model = mlp(seed=61)
        optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(self.lr), scale_local_gradients=False)
        optimizer.register_local_var(model.get_layer("second").kernel)
        model.compile(optimizer=optimizer, loss="mse")
        before, grads, mean, after = self.step(model, seed=200)
        for i in (0, 1, 3):
            self.assertAllClose(after[i], before[i] - self.lr * mean[i], rtol=1e-5, atol=1e-6)
        self.assertAllClose(after[2], before[2] - self.lr * grads[2], rtol=1e-5, atol=1e-6)

    def test_invalid_arguments(self):
        with self.assertRaisesRegex(ValueError, "must be Keras layers"):
            hvd.PartialDistributedOptimizer(keras.optimizers.SGD(), local_layers=["first"])
        with self.assertRaisesRegex(ValueError, "must be a ProcessSet"):
            hvd.PartialDistributedOptimizer(keras.optimizers.SGD(), process_set=object())
        with self.assertRaisesRegex(TypeError, "takes a Keras optimizer"):
            hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))


@keras.saving.register_keras_serializable(package="smdist_compat")
class HalvingSGD(keras.optimizers.SGD):
    """A user's own optimizer: SGD at half the rate."""

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient, variable, learning_rate * 0.5)


class LoadModelTest(CompatTest):
    def test_round_trip_gives_a_distributed_optimizer_with_the_saved_state(self):
        path = os.path.join(shared_dir(self), "model.keras")
        lr, momentum = 0.1, 0.9
        model = mlp(seed=70)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=momentum)), loss="mse")
        for step in range(2):  # the same data everywhere: the same state on every rank
            model.train_on_batch(*batch(seed=300 + step))
        if RANK == 0:
            model.save(path)
        sd.barrier()
        loaded = hvd.load_model(path)
        sd.barrier()  # read by every rank: rank 0 may clean its directory up
        optimizer = loaded.optimizer
        self.assertEqual(type(optimizer).__name__, "SGD")
        self.assertTrue(optimizer._smdist_reduces_in_apply)
        self.assertEqual(int(optimizer.iterations.numpy()), 2)
        self.assertAllEqual(flat([v.numpy() for v in optimizer.variables]),
                            flat([v.numpy() for v in model.optimizer.variables]))
        velocities = {v.path: v.numpy() for v in optimizer.variables}

        x, y = batch(seed=400 + RANK)
        before = [v.numpy() for v in loaded.trainable_variables]
        velocity = [next(m for path, m in velocities.items() if path.endswith(f"/{v.path.replace('/', '_')}_momentum"))
                    for v in loaded.trainable_variables]
        mean = [np.mean(g, axis=0) for g in zip(*everyone(local_gradients(loaded, x, y)))]
        loaded.train_on_batch(x, y)
        # Keras SGD with momentum: m = momentum * m - lr * g; w += m, with g averaged over ranks.
        for v, w, m, g in zip(loaded.trainable_variables, before, velocity, mean):
            self.assertAllClose(v.numpy(), w + momentum * m - lr * g, rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(flat(loaded.get_weights()))

    def test_custom_optimizers_are_wrapped_custom_objects_are_not(self):
        path = os.path.join(shared_dir(self), "custom.keras")
        if RANK == 0:
            model = mlp(seed=71)
            model.compile(optimizer=HalvingSGD(0.2), loss="mse")
            model.train_on_batch(*batch(seed=1))
            model.save(path)
        sd.barrier()
        wrapped = hvd.load_model(path, custom_optimizers=[HalvingSGD], compression=hvd.Compression.fp16)
        as_given = hvd.load_model(path, custom_objects={"smdist_compat>HalvingSGD": HalvingSGD})
        sd.barrier()  # read by every rank: rank 0 may clean its directory up
        self.assertIsInstance(wrapped.optimizer, HalvingSGD)
        self.assertTrue(wrapped.optimizer._smdist_reduces_in_apply)
        self.assertIs(type(wrapped.optimizer)._smdist_reducer.compression, hvd.Compression.fp16)
        # Horovod: an optimizer given in custom_objects is loaded as it is.
        self.assertIs(type(as_given.optimizer), HalvingSGD)
        self.assertFalse(getattr(as_given.optimizer, "_smdist_reduces_in_apply", False))


def recorder(model: keras.Model, seen: list) -> keras.callbacks.Callback:
    """Records (epoch, batch, learning rate) as each batch starts (place it after the schedules)."""
    epoch = [0]

    def on_batch(b, logs):
        seen.append((epoch[0], b, float(model.optimizer.learning_rate.numpy())))

    return keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epoch.__setitem__(0, e),
                                          on_train_batch_begin=on_batch)


class LearningRateScheduleTest(CompatTest):
    steps = 3

    def fit(self, callbacks, epochs: int):
        model = mlp(seed=80)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
        seen = []
        x, y = batch(seed=500 + RANK, n=4 * self.steps)
        history = model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0,
                            callbacks=[*callbacks, recorder(model, seen)])
        self.assertEqual(len(seen), epochs * self.steps)
        return model, seen, history.history

    def test_piecewise_schedule_matches_the_formula(self):
        initial = 0.4
        callbacks = [
            hvd.callbacks.LearningRateScheduleCallback(initial, multiplier=0.5, start_epoch=1, end_epoch=3),
            hvd.callbacks.LearningRateScheduleCallback(initial, multiplier=lambda e: 0.1 * e, start_epoch=3,
                                                       staircase=False),
        ]
        _, seen, logs = self.fit(callbacks, epochs=5)
        for epoch, b, lr in seen:
            if epoch == 0:
                want = 0.3  # before the schedule: the optimizer's own rate
            elif epoch < 3:
                want = initial * 0.5
            else:
                want = initial * 0.1 * (epoch + b / self.steps)
            self.assertAllClose(lr, want, rtol=1e-6, msg=f"epoch {epoch} batch {b}")
        # Horovod logs the rate at each epoch end as "lr".
        self.assertAllClose(logs["lr"], [0.3, 0.2, 0.2, initial * 0.1 * (3 + 2 / 3), initial * 0.1 * (4 + 2 / 3)])

    def test_callable_staircase(self):
        schedule = hvd.callbacks.LearningRateScheduleCallback(0.6, multiplier=lambda e: 1.0 / (e + 1), end_epoch=2)
        _, seen, _ = self.fit([schedule], epochs=3)
        for epoch, b, lr in seen:
            # Set at each epoch's first batch from the integer epoch; left alone from end_epoch on.
            self.assertAllClose(lr, 0.6 / (min(epoch, 1) + 1), rtol=1e-6, msg=f"epoch {epoch} batch {b}")

    def test_momentum_correction_for_the_changed_batch_only(self):
        model = mlp(seed=81)
        model.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.9), loss="mse")
        # Keras' own optimizers keep momentum as a float; one held in a variable is corrected.
        model.optimizer.momentum = keras.Variable(0.9, trainable=False, name="momentum")
        schedule = hvd.callbacks.LearningRateScheduleCallback(0.6, multiplier=lambda e: 1.0 / (e + 1))
        schedule.set_model(model)
        momenta = []
        for epoch in range(2):
            schedule.on_epoch_begin(epoch)
            for b in range(2):
                schedule.on_train_batch_begin(b)
                momenta.append(float(model.optimizer.momentum.numpy()))
                schedule.on_train_batch_end(b)
        # The rate goes 0.3 -> 0.6 at epoch 0 and 0.6 -> 0.3 at epoch 1: momentum × new/old for that batch.
        self.assertAllClose(momenta, [1.8, 0.9, 0.45, 0.9], rtol=1e-6)
        self.assertAllClose(float(model.optimizer.momentum.numpy()), 0.9)
        plain = hvd.callbacks.LearningRateScheduleCallback(0.6, multiplier=2.0, momentum_correction=False)
        plain.set_model(model)
        plain.on_epoch_begin(0)
        plain.on_train_batch_begin(0)
        self.assertAllClose([float(model.optimizer.momentum.numpy()), float(model.optimizer.learning_rate.numpy())],
                            [0.9, 1.2])

    def test_needs_steps_for_a_smooth_schedule(self):
        callback = hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda e: e, staircase=False)
        callback.set_params({"steps": None})
        with self.assertRaisesRegex(ValueError, "needs steps_per_epoch"):
            callback.on_train_begin()


class BestModelCheckpointTest(CompatTest):
    def test_writes_on_rank_zero_only_when_the_monitored_value_improves(self):
        directory = shared_dir(self)
        model = mlp(seed=90)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        callback = hvd.callbacks.BestModelCheckpoint()  # Horovod's signature: the path comes later
        with self.assertRaisesRegex(ValueError, "no filepath"):
            callback.on_train_begin()
        callback.filepath = os.path.join(directory, f"rank{RANK}-{{epoch}}.keras")
        callback.set_model(model)
        callback.on_train_begin()
        for epoch, val_loss in enumerate([0.5, 0.7, 0.3, 0.3, 0.1]):
            model.get_layer("first").kernel.assign(tf.fill([4, 5], float(epoch)))
            callback.on_epoch_begin(epoch)
            callback.on_epoch_end(epoch, {"val_loss": val_loss, "loss": 1.0})
        sd.barrier()
        written = sorted(os.listdir(directory))
        saved = keras.saving.load_model(os.path.join(directory, "rank0-3.keras"))
        sd.barrier()  # read by every rank: rank 0 may clean its directory up
        self.assertEqual(written, ["rank0-1.keras", "rank0-3.keras", "rank0-5.keras"])
        self.assertAllEqual(saved.get_layer("first").kernel.numpy(), np.full([4, 5], 2.0))

    def test_in_fit_after_metric_average(self):
        directory = shared_dir(self)
        model = mlp(seed=91)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse", metrics=["mae"])
        x, y = batch(seed=600 + RANK, n=16)
        vx, vy = batch(seed=700 + RANK, n=8)
        best = hvd.callbacks.BestModelCheckpoint(monitor="val_mae", mode="min", filepath=os.path.join(
            directory, "best-{epoch}.keras"))
        history = model.fit(x, y, batch_size=4, epochs=5, shuffle=False, verbose=0, validation_data=(vx, vy),
                            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                       hvd.callbacks.MetricAverageCallback(), best])
        monitored = history.history["val_mae"]
        for theirs in everyone(monitored):
            self.assertEqual(theirs, monitored)  # averaged over ranks by MetricAverageCallback
        improved, lowest = [], np.inf
        for epoch, value in enumerate(monitored):
            if value < lowest:
                improved.append(f"best-{epoch + 1}.keras")
                lowest = value
        sd.barrier()
        written = sorted(os.listdir(directory))
        sd.barrier()  # read by every rank: rank 0 may clean its directory up
        self.assertEqual(written, sorted(improved))
        # Only rank 0 tracks the best value (judged on every rank, so all fail together).
        self.assertEqual(everyone(best.best), [lowest] + [None] * (SIZE - 1))
