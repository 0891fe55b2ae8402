"""Optimizer-state sharding (ZeRO stages 1 and 2): same training as unsharded, checkpoints, errors.

Run on every rank by tests/test_sharding_multiprocess.py at 2 and 4 ranks, with dynamic
process sets. Every test
runs on every rank in the same order, so collectives pair up across ranks. Each
sharded run is compared with the unsharded run of the same optimizer, data and seed.
"""

from __future__ import annotations

import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import smdist_tf as sd
from smdist_tf.sharding.optimizer import ShardedApply
from tests.mp.rank_counts import at_two_ranks_only
from tests.mp.sync_assertions import SyncAssertions

RANK, SIZE = sd.rank(), sd.size()

RTOL = 1e-5
GLOBAL_BATCH = 16
RNG = np.random.default_rng(7)
X = RNG.normal(size=(64, 7)).astype(np.float32)
Y = RNG.normal(size=(64, 1)).astype(np.float32)
IDS = RNG.integers(0, 13, size=(64, 3)).astype(np.int32)

# Every optimizer the issue names; keyword settings exercise amsgrad, nesterov, centered, weight decay.
OPTIMIZERS = {
    "sgd_momentum": lambda **kw: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, **kw),
    "adam_amsgrad": lambda **kw: keras.optimizers.Adam(0.01, amsgrad=True, **kw),
    "adamw": lambda **kw: keras.optimizers.AdamW(0.01, weight_decay=0.05, **kw),
    "adagrad": lambda **kw: keras.optimizers.Adagrad(0.1, **kw),
    "rmsprop_centered": lambda **kw: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True, **kw),
    "lion": lambda **kw: keras.optimizers.Lion(0.003, **kw),
}


def mlp(seed: int = 3) -> keras.Model:
    """Uneven variables (35 and 5 elements divide by neither 2 nor 4) and a one-element bias."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((7,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)])


def embedding_model(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(13, 4)(ids))
    return keras.Model(ids, keras.layers.Dense(1)(pooled))


def relative_difference(a: list, b: list) -> float:
    return max(float(np.max(np.abs(p - q)) / (np.max(np.abs(p)) + 1e-12)) for p, q in zip(a, b))


def global_dataset(inputs: np.ndarray = X) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((inputs, Y)).batch(GLOBAL_BATCH)


def fit_under_strategy(shard: bool, make_optimizer, build=mlp, inputs: np.ndarray = X, stage2: bool = False,
                       policy: str = "float32", epochs: int = 2, prepare=None) -> keras.Model:
    keras.mixed_precision.set_global_policy(policy)
    try:
        strategy = sd.DataParallelStrategy(shard_optimizer_state=shard, shard_gradients=stage2 and shard)
        with strategy.scope():
            model = build()
            optimizer = make_optimizer()
            if prepare is not None:
                prepare(model, optimizer)
            model.compile(optimizer=optimizer, loss="mse")
        model.fit(global_dataset(inputs), epochs=epochs, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def my_rows(array: np.ndarray) -> np.ndarray:
    """This rank's part of each global batch, as the strategy would shard it."""
    per = GLOBAL_BATCH // SIZE
    return np.concatenate([array[b + RANK * per: b + (RANK + 1) * per] for b in range(0, len(array), GLOBAL_BATCH)])


def fit_with_distributed_optimizer(shard: bool, make_optimizer, build=mlp, inputs: np.ndarray = X,
                                   policy: str = "float32", **options) -> keras.Model:
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = build()
        model.compile(optimizer=sd.DistributedOptimizer(make_optimizer(), shard_optimizer_state=shard, **options),
                      loss="mse")
        model.fit(my_rows(inputs), my_rows(Y), batch_size=GLOBAL_BATCH // SIZE, epochs=2, verbose=0, shuffle=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def optimizers_for_path(path: int) -> list:
    """The optimizers a path (0: the strategy, 1: DistributedOptimizer) is checked with: all at 2 ranks.

    At 4 ranks, where a fit costs twice as much on the 2-core CI machine, each optimizer runs on one of the
    two paths (alternately): every optimizer's slots are still sharded 4 ways, and each path still runs
    three optimizers; the pairing of optimizer and path does not depend on the rank count.
    """
    items = list(OPTIMIZERS.items())
    return items if SIZE <= 2 else items[path::2]


def inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def shared_directory() -> str:
    return sd.broadcast_object(tempfile.mkdtemp(prefix="smdist_sharding_") if RANK == 0 else None)


class SameTrainingTest(SyncAssertions):
    def assert_same_training(self, sharded: keras.Model, unsharded: keras.Model) -> None:
        self.assertIsInstance(inner(sharded.optimizer), ShardedApply)
        self.assertNotIsInstance(inner(unsharded.optimizer), ShardedApply)
        self.assertLess(relative_difference(unsharded.get_weights(), sharded.get_weights()), RTOL)
        self.assert_identical_on_all_ranks(np.concatenate([w.ravel() for w in sharded.get_weights()]))

    def test_every_optimizer_fits_as_unsharded_under_the_strategy(self):
        for name, make in optimizers_for_path(0):
            with self.subTest(optimizer=name):
                self.assert_same_training(fit_under_strategy(True, make), fit_under_strategy(False, make))

    @at_two_ranks_only("each optimizer updates its shard element by element; the strategy's sweep shows 4 ranks")
    def test_every_optimizer_fits_as_unsharded_through_distributed_optimizer(self):
        for name, make in optimizers_for_path(1):
            with self.subTest(optimizer=name):
                self.assert_same_training(fit_with_distributed_optimizer(True, make),
                                          fit_with_distributed_optimizer(False, make))

    @at_two_ranks_only("Keras scales the loss on each rank, before the sharded update the sweeps above run at 4 ranks")
    def test_loss_scale_optimizer_under_mixed_precision(self):
        make = OPTIMIZERS["adam_amsgrad"]
        sharded = fit_under_strategy(True, make, policy="mixed_float16")
        self.assertIsInstance(sharded.optimizer, keras.optimizers.LossScaleOptimizer)
        self.assert_same_training(sharded, fit_under_strategy(False, make, policy="mixed_float16"))
        sharded = fit_with_distributed_optimizer(True, make, policy="mixed_float16")
        self.assert_same_training(sharded, fit_with_distributed_optimizer(False, make, policy="mixed_float16"))

    def test_slots_hold_this_ranks_shard_only(self):
        model = fit_under_strategy(True, OPTIMIZERS["adam_amsgrad"], epochs=1)
        optimizer = model.optimizer
        shard_sizes = [-(-int(np.prod(w.shape)) // SIZE) for w in model.trainable_weights]
        slots = [v for v in optimizer.variables if v.shape.rank == 1 and v.shape[0] in shard_sizes]
        self.assertEqual(len(slots), 3 * len(model.trainable_weights))  # m, v, v_hat
        self.assertEqual(sorted(v.shape[0] for v in slots), sorted(shard_sizes * 3))
        state_bytes = sum(int(np.prod(v.shape)) * 4 for v in optimizer.variables)
        full_bytes = 3 * 4 * sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        self.assertLessEqual(state_bytes, full_bytes / SIZE + 3 * 4 * len(shard_sizes) + 16)

    @at_two_ranks_only("which variables are excluded is decided per variable, not per shard layout")
    def test_weight_decay_exclusions_by_name_and_by_variable(self):
        make = lambda: keras.optimizers.AdamW(0.01, weight_decay=0.2)  # noqa: E731
        exclusions = {
            "by_name": lambda model, optimizer: optimizer.exclude_from_weight_decay(var_names=["bias"]),
            "by_variable": lambda model, optimizer: optimizer.exclude_from_weight_decay(
                var_list=[model.layers[0].kernel]),
        }
        for name, prepare in exclusions.items():
            with self.subTest(exclusion=name):
                self.assert_same_training(fit_under_strategy(True, make, prepare=prepare),
                                          fit_under_strategy(False, make, prepare=prepare))

    @at_two_ranks_only("gradients accumulate on each rank before the reduce-scatter the sweeps above run at 4 ranks")
    def test_gradient_accumulation_in_stage_one_and_stage_two(self):
        make = lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2)  # noqa: E731
        unsharded = fit_under_strategy(False, make)
        for stage2 in (False, True):
            with self.subTest(shard_gradients=stage2):
                sharded = fit_under_strategy(True, make, stage2=stage2)
                self.assert_same_training(sharded, unsharded)
                accumulators = inner(sharded.optimizer)._accumulated_gradients
                full = [tuple(w.shape) for w in sharded.trainable_weights]
                if stage2:
                    self.assertTrue(all(a.shape.rank == 1 for a in accumulators))
                else:
                    self.assertEqual([tuple(a.shape) for a in accumulators], full)

    @at_two_ranks_only("the global norm over 4 shards is shown by the strategy's clipnorm test below")
    def test_global_clipnorm_spans_the_shards_with_distributed_optimizer(self):
        for clip in ({"global_clipnorm": 0.05}, {"clipnorm": 0.02}, {"clipvalue": 0.01}):
            with self.subTest(**clip):
                make = lambda: keras.optimizers.Adam(0.01, **clip)  # noqa: E731
                self.assert_same_training(fit_with_distributed_optimizer(True, make),
                                          fit_with_distributed_optimizer(False, make))

    def test_global_clipnorm_under_the_strategy_clips_as_keras_does(self):
        make = lambda: keras.optimizers.SGD(0.1, momentum=0.5, global_clipnorm=0.05)  # noqa: E731
        self.assert_same_training(fit_under_strategy(True, make), fit_under_strategy(False, make))

    @at_two_ranks_only("an embedding's gradient is made dense before the reduce-scatter, on each rank alike")
    def test_embedding_gradients(self):
        # Dense after the reduce-scatter: equal to the unsharded run with dense gradients.
        for name in ("sgd_momentum", "lion"):
            with self.subTest(optimizer=name):
                make = OPTIMIZERS[name]
                self.assert_same_training(fit_under_strategy(True, make, build=embedding_model, inputs=IDS),
                                          fit_under_strategy(False, make, build=embedding_model, inputs=IDS))
        make = OPTIMIZERS["adam_amsgrad"]
        self.assert_same_training(
            fit_with_distributed_optimizer(True, make, build=embedding_model, inputs=IDS),
            fit_with_distributed_optimizer(False, make, build=embedding_model, inputs=IDS, sparse_as_dense=True))

    @at_two_ranks_only("strategy.run calls the same sharded apply as fit, whose sweep runs at 4 ranks")
    def test_custom_loop_under_strategy_run(self):
        def train(shard: bool) -> keras.Model:
            strategy = sd.DataParallelStrategy(shard_optimizer_state=shard)
            with strategy.scope():
                model = mlp()
                optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.1)

            @tf.function
            def step(x, y):
                def replica_step(x, y):
                    with tf.GradientTape() as tape:
                        loss = tf.nn.compute_average_loss(tf.square(model(x) - y)[:, 0],
                                                          global_batch_size=GLOBAL_BATCH)
                    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                                  model.trainable_variables))
                strategy.run(replica_step, args=(x, y))

            for x, y in strategy.experimental_distribute_dataset(global_dataset()):
                step(x, y)
            model.compile(optimizer=optimizer, loss="mse")  # attaches it for assert_same_training
            return model

        self.assert_same_training(train(True), train(False))

    @at_two_ranks_only("the tape's reduce-scatter is the one the sweeps above run at 4 ranks")
    def test_apply_sharded_gradients_with_a_distributed_gradient_tape(self):
        def train(shard: bool) -> keras.Model:
            model = mlp()
            optimizer = keras.optimizers.Adam(0.01, global_clipnorm=0.05)

            @tf.function
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - y))
                tape = sd.DistributedGradientTape(tape)
                if shard:
                    sd.apply_sharded_gradients(tape, optimizer, loss, model.trainable_variables)
                else:
                    grads = tape.gradient(loss, model.trainable_variables)
                    optimizer.apply_gradients(zip(grads, model.trainable_variables))

            xs, ys = my_rows(X), my_rows(Y)
            per = GLOBAL_BATCH // SIZE
            for b in range(0, len(xs), per):
                step(xs[b:b + per], ys[b:b + per])
            model.compile(optimizer=optimizer, loss="mse")
            return model

        self.assert_same_training(train(True), train(False))

    def test_a_process_set_shards_over_its_members_only(self):
        members = [0, 1]  # every rank at 2 ranks: the global set, passed explicitly
        process_set = sd.add_process_set(members) if SIZE > 2 else sd.global_process_set
        per = GLOBAL_BATCH // len(members)
        index = max(process_set.rank(), 0)
        rows = np.concatenate([np.arange(b + index * per, b + (index + 1) * per) for b in range(0, len(X), GLOBAL_BATCH)])

        def train(shard: bool) -> keras.Model:
            # Every rank makes the same Keras objects, so Keras' automatic names (and with them
            # the node names that match later graph collectives across ranks) stay alike.
            model = mlp()
            optimizer = sd.DistributedOptimizer(OPTIMIZERS["adamw"](), shard_optimizer_state=shard,
                                                process_set=process_set)
            model.compile(optimizer=optimizer, loss="mse")
            if process_set.included():
                model.fit(X[rows], Y[rows], batch_size=per, epochs=2, verbose=0, shuffle=False)
            return model

        try:
            sharded, unsharded = train(True), train(False)
            if process_set.included():
                self.assertLess(relative_difference(unsharded.get_weights(), sharded.get_weights()), RTOL)
                kernel = sharded.optimizer.variables[2]
                self.assertEqual(tuple(kernel.shape), (-(-35 // len(members)),))
        finally:
            if SIZE > 2:
                sd.remove_process_set(process_set)


class ShardedCheckpointTest(SyncAssertions):
    def test_saved_state_is_the_full_state_and_loads_sharded_and_unsharded(self):
        directory = shared_directory()
        path = os.path.join(directory, "sharded.keras")
        sharded = fit_under_strategy(True, OPTIMIZERS["adam_amsgrad"])
        with sd.sharding.gathered_state(sharded):
            gathered = inner(sharded.optimizer).smdist_gather_state()
        full = [gathered.get(id(v), None) for v in sharded.optimizer.variables]
        sd.distribute.save_on_rank_zero(sharded, path)

        plain = keras.saving.load_model(path)  # plain Keras: the unsharded layout
        self.assertNotIsInstance(plain.optimizer, ShardedApply)
        for mine, saved, variable in zip(full, plain.optimizer.variables, sharded.optimizer.variables):
            expected = variable.numpy() if mine is None else mine
            self.assertAllEqual(saved.numpy(), expected)

        with sd.DataParallelStrategy(shard_optimizer_state=True).scope():
            restored = keras.saving.load_model(path)
        self.assertIsInstance(restored.optimizer, ShardedApply)
        for a, b in zip(restored.optimizer.variables, sharded.optimizer.variables):
            self.assertAllEqual(a.numpy(), b.numpy())

        # Unsharded file -> sharded optimizer: each rank keeps its slice.
        unsharded_path = os.path.join(directory, "unsharded.weights.h5")
        sd.distribute.save_on_rank_zero(plain, unsharded_path)
        with sd.DataParallelStrategy(shard_optimizer_state=True).scope():
            model = mlp()
            model.compile(optimizer=OPTIMIZERS["adam_amsgrad"](), loss="mse")
            model.optimizer.build(model.trainable_variables)
        model.load_weights(unsharded_path)
        for a, b in zip(model.optimizer.variables, sharded.optimizer.variables):
            self.assertAllEqual(a.numpy(), b.numpy())
        self.assertAllEqual(np.concatenate([w.ravel() for w in model.get_weights()]),
                            np.concatenate([w.ravel() for w in sharded.get_weights()]))

    def test_model_checkpoint_callback_writes_the_full_state(self):
        path = os.path.join(shared_directory(), "callback.keras")
        strategy = sd.DataParallelStrategy(shard_optimizer_state=True)
        with strategy.scope():
            model = mlp()
            model.compile(optimizer=OPTIMIZERS["rmsprop_centered"](), loss="mse")
        model.fit(global_dataset(), epochs=1, verbose=0, callbacks=[sd.keras.callbacks.ModelCheckpoint(path)])
        with sd.sharding.gathered_state(model):
            gathered = model.optimizer.smdist_gather_state()
        saved = keras.saving.load_model(path).optimizer.variables
        for variable, in_file in zip(model.optimizer.variables, saved):
            self.assertAllEqual(in_file.numpy(), gathered.get(id(variable), variable.numpy()))

    def test_direct_saves_raise_on_every_rank_instead_of_writing_shards(self):
        directory = shared_directory()
        model = fit_under_strategy(True, OPTIMIZERS["lion"], epochs=1)
        with self.assertRaisesRegex(ValueError, "sharded over the ranks"):
            model.save(os.path.join(directory, f"direct_{RANK}.keras"))
        checkpoint = tf.train.Checkpoint(optimizer=model.optimizer)
        with self.assertRaisesRegex(ValueError, "tf.train.Checkpoint"):
            checkpoint.write(os.path.join(directory, f"ckpt_{RANK}"))
        with self.assertRaisesRegex(ValueError, "tf.train.Checkpoint"):
            sd.distribute.save_on_rank_zero(checkpoint, os.path.join(directory, "ckpt"))
        self.assert_engine_healthy()

    def test_bad_checkpoints_raise_on_every_rank(self):
        directory = shared_directory()
        other = mlp()  # the same layers, an optimizer with other variables
        other.compile(optimizer=keras.optimizers.SGD(), loss="mse")
        other.optimizer.build(other.trainable_variables)
        wrong = os.path.join(directory, "other.weights.h5")
        truncated = os.path.join(directory, "truncated.weights.h5")
        if RANK == 0:
            other.save_weights(wrong)
            with open(wrong, "rb") as f:
                data = f.read()
            with open(truncated, "wb") as f:
                f.write(data[: len(data) // 2])
        sd.barrier()
        with sd.DataParallelStrategy(shard_optimizer_state=True).scope():
            model = mlp()
            model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
            model.optimizer.build(model.trainable_variables)
        with self.assertRaisesRegex(ValueError, "the checkpoint holds"):
            model.load_weights(wrong)
        with self.assertRaises((ValueError, OSError)):
            model.load_weights(truncated)
        self.assert_engine_healthy()


class ShardingErrorsTest(SyncAssertions):
    def test_unsupported_optimizers_and_settings_raise_on_every_rank(self):
        strategy = sd.DataParallelStrategy(shard_optimizer_state=True)
        for make in (keras.optimizers.Lamb, keras.optimizers.Adafactor):
            with self.subTest(optimizer=make.__name__), self.assertRaisesRegex(ValueError, "element-wise"):
                with strategy.scope():
                    make()
            with self.assertRaisesRegex(ValueError, "element-wise"):
                sd.DistributedOptimizer(make(), shard_optimizer_state=True)
        with self.assertRaisesRegex(ValueError, "compression"):
            sd.DataParallelStrategy(shard_optimizer_state=True, compression=sd.Compression.fp16)
        with self.assertRaisesRegex(ValueError, "compression"):
            sd.DistributedOptimizer(keras.optimizers.Adam(), shard_optimizer_state=True,
                                    compression=sd.Compression.fp16)
        with self.assertRaisesRegex(ValueError, "gradient_accumulation_steps"):
            sd.DistributedOptimizer(keras.optimizers.Adam(), shard_optimizer_state=True, backward_passes_per_step=2)
        variable = keras.Variable(np.zeros(3, np.float32))
        built = keras.optimizers.Adam()
        built.build([variable])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variable * variable)
        with self.assertRaisesRegex(ValueError, "before the optimizer is built"):
            sd.apply_sharded_gradients(sd.DistributedGradientTape(tape), built, loss, [variable])
        model = fit_under_strategy(True, OPTIMIZERS["sgd_momentum"], epochs=1)
        with self.assertRaisesRegex(ValueError, "elastic state cannot hold sharded"):
            sd.elastic.TensorFlowKerasState(model)
        self.assert_engine_healthy()


    def test_uneven_batches_with_distributed_optimizer_fail_on_every_rank(self):
        # A rank that ran out joins; a reduce-scatter cannot complete without it.
        model = mlp()
        model.compile(optimizer=sd.DistributedOptimizer(keras.optimizers.Adam(), shard_optimizer_state=True),
                      loss="mse")
        rows = 8 * (3 if RANK == 0 else 2)
        with self.assertRaises(tf.errors.FailedPreconditionError):
            model.fit(X[:rows], Y[:rows], batch_size=8, epochs=1, verbose=0)
        self.assert_engine_healthy()


if __name__ == "__main__":
    pytest.main([__file__])
