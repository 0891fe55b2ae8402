"""Pipeline parallelism: point-to-point ops, PipelineModel gradients, fit, checkpoints and errors.

Run on every rank by tests/test_pipeline_multiprocess.py (2 and 4 ranks). Every test
runs on every rank in the same order, so collectives and messages pair up.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf import pipeline
from smdist_tf.keras import OffloadActivations, PipelineModel
from smdist_tf.pipeline import partition, schedule
from smdist_tf.pipeline.exchange import GroupPlan, from_bytes, to_bytes
from smdist_tf.pipeline.offload import HOST_DEVICE
from tests.mp.rank_counts import at_two_ranks_only

RANK, SIZE = sd.rank(), sd.size()
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# (num_stages, data-parallel replicas) this world size can run.
CONFIGS = [(SIZE, 1)] + ([(SIZE // 2, 2)] if SIZE >= 4 else [])


def data(n: int, seed: int = 0, features: int = 8):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = ((x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)).astype(np.int64)
    return x, y


def mlp(seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(10, activation="tanh") for _ in range(3)]
                            + [keras.layers.Dense(3)])


def skip_model(seed: int = 2) -> keras.Model:
    """Skips that cross stage boundaries: from the first dense to the end, and from the input to the end."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8,))
    a = keras.layers.Dense(10, activation="tanh", name="a")(inp)
    b = keras.layers.Dense(10, activation="tanh", name="b")(a)
    c = keras.layers.Dense(10, activation="tanh", name="c")(b)
    s = keras.layers.Add(name="add")([a, c])
    j = keras.layers.Concatenate(name="join")([s, inp])
    return keras.Model(inp, keras.layers.Dense(3, name="out")(j))


def tied_model(seed: int = 3) -> keras.Model:
    """One Dense layer called at the start and near the end: its weights live in two stages."""
    keras.utils.set_random_seed(seed)
    shared = keras.layers.Dense(8, activation="tanh", name="shared")
    inp = keras.Input((8,))
    h = shared(inp)
    h = keras.layers.Dense(8, activation="tanh", name="mid1")(h)
    h = keras.layers.Dense(8, activation="tanh", name="mid2")(h)
    h = shared(h)
    return keras.Model(inp, keras.layers.Dense(3, name="head")(h))


def reference(model_fn, x, y):
    """Loss and gradients of the unpartitioned model on the whole batch."""
    model = model_fn()
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x))
    return float(loss), tape.gradient(loss, model.trainable_variables)


def regularized_model(seed: int = 10) -> keras.Model:
    """Weight regularizers (one on a layer tied across stages) and an activity regularizer."""
    keras.utils.set_random_seed(seed)
    l2 = keras.regularizers.L2
    shared = keras.layers.Dense(8, activation="tanh", kernel_regularizer=l2(0.01), name="shared")
    inp = keras.Input((8,))
    h = shared(inp)
    h = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L1(0.01),
                           bias_regularizer=l2(0.1), name="mid1")(h)
    h = keras.layers.Dense(8, activation="tanh", activity_regularizer=l2(0.05), name="mid2")(h)
    h = shared(h)
    return keras.Model(inp, keras.layers.Dense(3, kernel_regularizer=l2(0.02), name="head")(h))


def elements(variables) -> int:
    return sum(int(np.prod(v.shape)) for v in variables)


def held_elements(pm: PipelineModel) -> int:
    """Elements of the unpartitioned model's variables that have a value in this process (Keras' own state)."""
    return elements(v for v in pm.unpartitioned.variables if v._value is not None)


def assert_gradients_match(test, pm, loss, pairs, want_loss, want_grads, where="", rtol=1e-4, atol=1e-6):
    test.assertAllClose(float(loss), want_loss, rtol=1e-5, msg=where)
    positions = [id(v) for v in pm.unpartitioned.trainable_variables]
    for variable, grad in pairs:
        test.assertAllClose(grad, want_grads[positions.index(id(variable))], rtol=rtol, atol=atol,
                            msg=f"{where}: {variable.path}")


class PipelineMemoryTest(tf.test.TestCase):
    """A rank holds its stage's weights only: counted in Keras' variables and in TensorFlow's allocator.

    First in the file: placed after the other classes it took 15-20 s in the shared job (its gc.collect()
    before measuring meets their pipelines' garbage), against 4 s here.
    """

    # Many small layers: a layer's initialisation temporaries stay small next to a stage.
    WIDTH, DEPTH = 128, 16

    def wide(self) -> keras.Model:
        keras.utils.set_random_seed(11)
        return keras.Sequential([keras.Input((self.WIDTH,))]
                                + [keras.layers.Dense(self.WIDTH, activation="tanh") for _ in range(self.DEPTH)])

    def build_measured(self, make) -> tuple[PipelineModel, int, int]:
        """Wraps what ``make()`` returns; returns the pipeline and the CPU allocator's (peak, current) growth in bytes."""
        gc.collect()
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        tf.config.experimental.reset_memory_stats("CPU:0")
        pm = PipelineModel(make(), num_stages=SIZE, num_microbatches=2, partition="uniform", verbose=False)
        info = tf.config.experimental.get_memory_info("CPU:0")
        return pm, info["peak"] - base, info["current"] - base

    def test_model_fn_materialises_only_this_stage(self):
        full = elements(self.wide().variables)
        layer_bytes = (self.WIDTH * self.WIDTH + self.WIDTH) * 4
        pm, peak, _ = self.build_measured(lambda: self.wide)
        self.assertEqual(held_elements(pm), full // SIZE)
        self.assertEqual(int(sd.allreduce(tf.constant(held_elements(pm), tf.int64), op=sd.Sum, name="mem.total")), full)
        # The allocator never saw the whole model: the stage plus a layer's initialisation in flight.
        self.assertLess(peak, full * 4 // SIZE + 4 * layer_bytes)
        self.assertLess(peak, full * 4)
        # Initial values are the unpartitioned model's.
        for v, want in zip(pm.unpartitioned.variables, self.wide().variables):
            if v._value is not None:
                self.assertAllEqual(v, want, msg=v.path)
        # Training (Keras traces the whole model for shapes inside fit) materialises nothing more;
        # the optimizer holds state for this stage only.
        x = np.random.default_rng(0).normal(size=(8, self.WIDTH)).astype(np.float32)
        pm.compile(optimizer="adam", loss="mse")
        pm.fit(x, x, batch_size=8, epochs=1, verbose=0)
        self.assertEqual(held_elements(pm), full // SIZE)
        slots = [v for v in pm.optimizer.variables if len(v.shape) > 0]
        self.assertEqual(elements(slots), 2 * full // SIZE)
        # Another stage's weight cannot be read by accident (no silent fresh initial values).
        foreign = next(v for v in pm.unpartitioned.variables if v._value is None)
        with self.assertRaisesRegex(RuntimeError, "does not hold it"):
            foreign.numpy()
        with self.assertRaisesRegex(RuntimeError, "split over ranks"):
            pm(x)

    @at_two_ranks_only("a stage's release does not depend on the stage count; the model_fn test above measures 1/N at 4 ranks")
    def test_built_model_releases_other_stages(self):
        full = elements(self.wide().variables)
        layer_bytes = (self.WIDTH * self.WIDTH + self.WIDTH) * 4
        pm, peak, current = self.build_measured(self.wide)
        # Built whole (the allocator saw the full model), then only this stage is kept.
        self.assertGreaterEqual(peak, full * 4)
        self.assertEqual(held_elements(pm), full // SIZE)
        self.assertLess(current, full * 4 // SIZE + 2 * layer_bytes)
        with self.assertRaisesRegex(ValueError, "already wrapped"):
            PipelineModel(pm.unpartitioned, num_stages=SIZE, num_microbatches=2, partition=[1] * (SIZE - 1)
                          + [self.DEPTH - SIZE + 1], verbose=False)


class PointToPointTest(tf.test.TestCase):
    def test_ring_exchange_with_changing_shapes_both_sending_first(self):
        right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        for shape in ([3, 2], [3, 2], [2, 3], [6], [0, 4], [300, 300]):
            pipeline.send([tf.fill(shape, float(RANK)), tf.constant([RANK], tf.int64)], right, tag=3)
            got, who = pipeline.recv([tf.float32, tf.int64], left, tag=3)
            self.assertEqual(got.shape, shape)
            self.assertAllEqual(who, [left])
            if got.shape.num_elements():
                self.assertAllEqual(tf.reduce_max(got), float(left))

    def test_tags_are_independent_and_ordered(self):
        peer = RANK ^ 1
        for i in range(3):
            pipeline.send([tf.constant([i], tf.int32)], peer, tag=10)
            pipeline.send([tf.constant([100 + i], tf.int32)], peer, tag=11)
        late = [int(pipeline.recv([tf.int32], peer, tag=11)[0][0]) for _ in range(3)]
        early = [int(pipeline.recv([tf.int32], peer, tag=10)[0][0]) for _ in range(3)]
        self.assertEqual(early, [0, 1, 2])
        self.assertEqual(late, [100, 101, 102])

    def test_inside_tf_function_with_shape_hints_and_half(self):
        peer = RANK ^ 1

        @tf.function
        def swap(x):
            pipeline.send([x], peer, tag=4)
            return pipeline.recv([tf.float16], peer, tag=4, shapes=[[None, 4]])[0]

        for rows in (2, 2, 5):
            got = swap(tf.fill([rows, 4], tf.cast(RANK, tf.float16)))
            self.assertEqual(got.shape, [rows, 4])
            self.assertEqual(float(got[0, 0]), float(peer))

    def test_mismatched_dtype_and_bad_peer_raise(self):
        peer = RANK ^ 1
        pipeline.send([tf.ones([2])], peer, tag=5)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "float32, expected int32"):
            pipeline.recv([tf.int32], peer, tag=5)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "is not a rank"):
            pipeline.send([tf.ones([1])], SIZE + 3, tag=5)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "itself"):
            pipeline.recv([tf.float32], RANK, tag=5)


class GroupExchangeTest(tf.test.TestCase):
    """Sums and broadcasts within groups of ranks (gradient sync, initial weights), each group a process set."""

    SPECS = [  # (holders, dtype, shape)
        ((0, 1), tf.float32, (3, 5)),
        (tuple(range(SIZE)), tf.float16, (7,)),
        ((1,), tf.float32, (2,)),  # held by one rank: never moves
        ((0, SIZE - 1), tf.int32, (4,)),
        (tuple(range(SIZE)), tf.float64, (0,)),
        ((0, 1), tf.bfloat16, (1,)),
        (tuple(range(1, SIZE)) or (1,), tf.float32, (2, 2)),
    ]

    def value(self, k, rank):
        holders, dtype, shape = self.SPECS[k]
        return tf.cast(tf.reshape(tf.range(int(np.prod(shape)), dtype=tf.float32), shape) + 10 * rank + k, dtype)

    def test_sum_and_broadcast_within_groups(self):
        mine = [k for k, (holders, _, _) in enumerate(self.SPECS) if RANK in holders]
        plan = GroupPlan([h for h, _, _ in self.SPECS], [mine.index(k) if k in mine else None for k in range(len(self.SPECS))])
        groups = sorted({h for h, _, _ in self.SPECS if len(h) > 1})
        self.assertEqual(sorted(plan.sets), groups)
        self.assertEqual([plan.sets[g].ranks for g in groups], [list(g) for g in groups])
        values = [self.value(k, RANK) for k in mine]
        summed = plan.reduce(values, postscale=0.5)
        first = plan.broadcast(values)
        for got_sum, got_first, k in zip(summed, first, mine):
            holders, dtype, shape = self.SPECS[k]
            want = tf.add_n([tf.cast(self.value(k, r), tf.float64) for r in holders])
            if len(holders) > 1:
                want = want * 0.5
                if dtype.is_integer:
                    want = tf.cast(tf.cast(want, dtype), tf.float64)  # scaled, then truncated
            self.assertEqual((got_sum.dtype, tuple(got_sum.shape)), (dtype, shape))
            self.assertAllClose(tf.cast(got_sum, tf.float64), want, msg=f"sum {k}")
            self.assertAllEqual(got_first, self.value(k, holders[0]), msg=f"broadcast {k}")
        # A second plan over the same groups reuses their sets.
        again = GroupPlan([h for h, _, _ in self.SPECS], [None] * len(self.SPECS))
        self.assertEqual({g: s.process_set_id for g, s in again.sets.items()},
                         {g: s.process_set_id for g, s in plan.sets.items()})

    def test_bytes_round_trip_every_dtype(self):
        for dtype in (tf.bool, tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64):
            value = tf.cast(tf.reshape(tf.range(6) % 3, [2, 3]), dtype)
            data = to_bytes(value)
            self.assertEqual((data.dtype, int(data.shape[0])), (tf.uint8, 6 * dtype.size))
            self.assertAllEqual(from_bytes(data, dtype, [2, 3]), value)


class ScheduleAndPartitionTest(tf.test.TestCase):
    def test_schedules_hold_at_most_their_bound(self):
        for p in (2, 4):
            for m in (1, 3, 8):
                for s in range(p):
                    one = schedule.build("1f1b", s, p, m)
                    gp = schedule.build("gpipe", s, p, m)
                    for actions in (one, gp):
                        self.assertEqual(sorted(actions), sorted([schedule.Action(k, i) for k in "FB" for i in range(m)]))
                    self.assertEqual(schedule.max_in_flight(one), min(p - s, m))
                    self.assertEqual(schedule.max_in_flight(gp), m)
        self.assertAlmostEqual(schedule.theoretical_bubble(4, 8), 3 / 11)

    def test_partition_specs(self):
        names = ["a", "b", "c", "d", "e"]
        self.assertEqual(partition.resolve("auto", names, [100, 0, 100, 0, 100], 3), [1, 2, 2])
        self.assertEqual(partition.resolve("auto", names, [300, 10, 10, 10, 10], 2), [1, 4])
        self.assertEqual(partition.resolve("uniform", names, [1] * 5, 2), [3, 2])
        self.assertEqual(partition.resolve([1, 4], names, [1] * 5, 2), [1, 4])
        self.assertEqual(partition.resolve(["a", "d"], names, [1] * 5, 2), [3, 2])
        with self.assertRaisesRegex(ValueError, "more than the model's 5 layers"):
            partition.resolve("auto", names, [1] * 5, 6)
        with self.assertRaisesRegex(ValueError, "add up"):
            partition.resolve([2, 2], names, [1] * 5, 2)
        with self.assertRaisesRegex(ValueError, "does not have"):
            partition.resolve(["a", "zz"], names, [1] * 5, 2)


class PipelineGradientTest(tf.test.TestCase):
    def check_model(self, model_fn, part):
        x, y = data(16, seed=4)
        want_loss, want_grads = reference(model_fn, x, y)
        for stages, replicas in CONFIGS:
            for sched in ("1f1b", "gpipe"):
                # Both ways of giving the model: a function (each rank builds only its
                # stage's weights) and a built model (other stages' weights released).
                pm = PipelineModel(model_fn if sched == "1f1b" else model_fn(), num_stages=stages, num_microbatches=2,
                                   schedule=sched, partition=part, verbose=False)
                inner = pm.unpartitioned
                self.assertEqual((pm.pp_size(), pm.dp_size()), (stages, replicas))
                pm.compile(optimizer="sgd", loss=LOSS)
                loss, pairs = pm.pipeline_gradients(x, y)
                where = f"{stages} stages x {replicas}, {sched}"
                self.assertAllClose(float(loss), want_loss, rtol=1e-5, msg=where)
                positions = [id(v) for v in inner.trainable_variables]
                for variable, grad in pairs:
                    self.assertAllClose(grad, want_grads[positions.index(id(variable))], rtol=1e-4, atol=1e-6,
                                        msg=f"{where}: {variable.path}")

    def test_sequential_mlp(self):
        self.check_model(mlp, "auto")

    def test_functional_skips_across_stages(self):
        self.check_model(skip_model, "uniform")

    def test_tied_weights_summed_over_stages(self):
        self.check_model(tied_model, "uniform")
        # The shared layer really is replicated in two stages.
        pm = PipelineModel(tied_model(), num_stages=SIZE, num_microbatches=1, partition="uniform", verbose=False)
        holds = float("shared/kernel" in " ".join(v.path for v in pm.stage_variables))
        self.assertEqual(float(sd.allreduce(tf.constant(holds), op=sd.Sum, name="tied.holders")), 2.0)

    def test_recompute_gives_the_same_gradients(self):
        x, y = data(8, seed=5)
        _, want = reference(mlp, x, y)
        inner = mlp()
        pm = PipelineModel(inner, num_stages=SIZE, num_microbatches=4, recompute=True, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        _, pairs = pm.pipeline_gradients(x, y)
        positions = [id(v) for v in inner.trainable_variables]
        for variable, grad in pairs:
            self.assertAllClose(grad, want[positions.index(id(variable))], rtol=1e-4, atol=1e-6)


class PipelineOffloadTest(tf.test.TestCase):
    """offload_activations=True: the stage inputs recompute=True keeps wait in host memory; nothing else changes."""

    # 2 stages, alone at 2 ranks and with 2 replicas at 4.
    CONFIGS = [(stages, replicas) for stages, replicas in CONFIGS if stages == 2]

    def test_gradients_identical_to_recompute_alone(self):
        x, y = data(8, seed=6)
        runs = {}
        for stages, replicas in self.CONFIGS:
            for sched in schedule.SCHEDULES:
                for offload in (False, True):
                    pm = PipelineModel(mlp, num_stages=stages, num_microbatches=4, schedule=sched, recompute=True,
                                       offload_activations=offload, verbose=False)
                    pm.compile(optimizer="sgd", loss=LOSS)
                    loss, pairs = pm.pipeline_gradients(x, y)
                    runs[stages, replicas, sched, offload] = [loss.numpy()] + [g.numpy() for _, g in pairs]
        # Compared once every rank has run every step, so a mismatch cannot leave the ranks out of step.
        # Equal to 1e-7, not bit for bit: two pipelines without offloading differ by that much (1.5e-8 seen)
        # as TensorFlow's CPU kernels are not bitwise reproducible from one build of a model to the next.
        for (stages, replicas, sched, offload), values in runs.items():
            if offload:
                for without, with_offload in zip(runs[stages, replicas, sched, False], values):
                    self.assertAllClose(without, with_offload, rtol=0, atol=1e-7,
                                        msg=f"{stages} stages x {replicas}, {sched}")

    def test_stage_inputs_wait_on_the_host_and_come_back_in_the_backward(self):
        x, y = data(8, seed=7)
        stages, _ = self.CONFIGS[-1]
        pm = PipelineModel(mlp, num_stages=stages, num_microbatches=4, schedule="gpipe", recompute=True,
                           offload_activations=True, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        # The step's own arguments, to look up the graph it traced.
        step_fn, calls = pm._runner._step_fn, []
        pm._runner._step_fn = lambda *args: calls.append(args) or step_fn(*args)
        pm.pipeline_gradients(x, y)
        graph = step_fn.get_concrete_function(*calls[0]).graph
        host = tf.DeviceSpec.from_string(HOST_DEVICE).replace(device_index=0)
        copies = [op for op in graph.get_operations() if op.type == "Identity" and "offload_to_host" in op.name]
        # GPipe runs every forward before any backward: every microbatch's stage inputs go to the host.
        self.assertLen(copies, 4 * len(pm._runner.in_ids))
        for op in copies:
            self.assertEqual(tf.DeviceSpec.from_string(op.device), host, msg=op.name)
        fetches = [op for op in graph.get_operations() if op.type == "Identity" and "fetch_from_host" in op.name]
        self.assertEqual(sorted(op.inputs[0].op.name for op in fetches), sorted(op.name for op in copies))
        for op in fetches:  # held back until the schedule reaches them, not run as soon as the copy exists
            self.assertNotEmpty(op.control_inputs, msg=op.name)

    def test_offloaded_blocks_inside_stages(self):
        def offloaded_mlp():  # mlp() with its hidden layers wrapped: the same weights
            keras.utils.set_random_seed(1)
            hidden = [OffloadActivations(keras.layers.Dense(10, activation="tanh")) for _ in range(3)]
            return keras.Sequential([keras.Input((8,))] + hidden + [keras.layers.Dense(3)])

        x, y = data(8, seed=8)
        want_loss, want_grads = reference(mlp, x, y)
        stages, replicas = self.CONFIGS[-1]
        pm = PipelineModel(offloaded_mlp, num_stages=stages, num_microbatches=4, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        loss, pairs = pm.pipeline_gradients(x, y)
        assert_gradients_match(self, pm, loss, pairs, want_loss, want_grads, f"{stages} stages x {replicas}")

    def test_offloading_without_recompute_is_refused_everywhere(self):
        with self.assertRaisesRegex(ValueError, "pass recompute=True too"):
            PipelineModel(mlp, num_stages=SIZE, num_microbatches=2, offload_activations=True, verbose=False)


class PipelineTrainingTest(tf.test.TestCase):
    @at_two_ranks_only("convergence does not depend on the replica count; 2 stages x 2 replicas are held to the "
                       "unpartitioned model's fit, evaluate and predict in PipelineUnevenBatchTest")
    def test_fit_converges_on_digits_with_global_logs(self):
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = (digits.data[:1536] / 16.0).astype(np.float32)
        y = digits.target[:1536].astype(np.int64)
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(32, activation="relu"), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(10)])
        stages = 2
        pm = PipelineModel(model, num_stages=stages, num_microbatches=4, schedule="1f1b", verbose=False)
        pm.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, metrics=["accuracy"])
        history = pm.fit(x, y, batch_size=64, epochs=5, shuffle=False, verbose=0)
        losses = history.history["loss"]
        self.assertLess(losses[-1], 0.5 * losses[0])
        loss, accuracy = pm.evaluate(x, y, batch_size=256, verbose=0)
        self.assertGreater(accuracy, 0.85)
        predictions = pm.predict(x[:256], batch_size=128, verbose=0)
        self.assertEqual(predictions.shape, (256, 10))
        # Callbacks must decide alike: every rank saw the same numbers.
        mine = tf.constant([losses[-1], loss, accuracy, float(predictions.sum())], tf.float64)
        everyone = sd.allgather(mine[None], name="digits.logs").numpy()
        for r in range(SIZE):
            self.assertAllEqual(everyone[r], mine.numpy(), msg=f"rank {r} saw other logs")

    def test_checkpoint_from_two_stages_loads_into_other_stage_counts(self):
        x, y = data(16, seed=6)
        directory = sd.broadcast_object(tempfile.mkdtemp(prefix="pipeline-ckpt-") if RANK == 0 else None)
        path = os.path.join(directory, "two-stages.weights.h5")
        pm = PipelineModel(mlp, num_stages=2, num_microbatches=2, verbose=False)
        pm.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
        pm.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        held = held_elements(pm)
        pm.save_weights(path)
        self.assertEqual(held_elements(pm), held, "saving must stream the weights, not materialise them")
        stage_file = pm.save_stage_weights(directory)
        expected = pm.predict(x, batch_size=8, verbose=0)
        plain = mlp(seed=99)
        plain.load_weights(path)  # plain Keras reads the file
        self.assertAllClose(plain.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
        for stages in [1, 2, 4]:
            if SIZE % stages or stages > 4:
                continue
            # Built by a function (only this stage's weights) or built whole (then released).
            builder = (lambda: mlp(seed=50 + stages)) if stages != 2 else mlp(seed=52)
            other = PipelineModel(builder, num_stages=stages, num_microbatches=2, verbose=False)
            other.compile(loss=LOSS)
            other.load_weights(path)
            self.assertAllClose(other.predict(x, batch_size=8, verbose=0), expected, rtol=1e-5, atol=1e-6,
                                msg=f"{stages} stages")
        # A file plain Keras wrote loads into a pipeline.
        own = os.path.join(directory, f"plain-{RANK}.weights.h5")
        plain.save_weights(own)
        from_plain = PipelineModel(lambda: mlp(seed=97), num_stages=SIZE, num_microbatches=2, verbose=False)
        from_plain.compile(loss=LOSS)
        from_plain.load_weights(own)
        self.assertAllClose(from_plain.predict(x, batch_size=8, verbose=0), expected, rtol=1e-5, atol=1e-6)
        again = PipelineModel(mlp(seed=98), num_stages=2, num_microbatches=2, verbose=False)
        again.compile(loss=LOSS)
        again.load_stage_weights(directory)
        self.assertTrue(os.path.exists(stage_file))
        self.assertAllClose(again.predict(x, batch_size=8, verbose=0), expected, rtol=1e-5, atol=1e-6)
        # gather_weights materialises the whole model on every rank, which can then run it alone.
        pm.gather_weights()
        self.assertEqual(held_elements(pm), elements(pm.unpartitioned.variables))
        self.assertAllClose(pm.unpartitioned.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)

    def test_checkpoint_errors_raise_everywhere(self):
        directory = sd.broadcast_object(tempfile.mkdtemp(prefix="pipeline-bad-") if RANK == 0 else None)
        path = os.path.join(directory, "narrow.weights.h5")
        narrow = keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(4) for _ in range(4)])
        if RANK == 0:
            narrow.save_weights(path)
        sd.barrier(name="bad.written")
        pm = PipelineModel(mlp, num_stages=SIZE, num_microbatches=2, verbose=False)
        # Only some stages' layers differ, yet every rank checks the whole file and raises.
        with self.assertRaisesRegex(ValueError, "has shape"):
            pm.load_weights(path)
        with self.assertRaisesRegex(ValueError, r"\.weights\.h5"):
            pm.save_weights(os.path.join(directory, "model.keras"))
        # Only rank 0 writes; when it cannot, every rank raises.
        with self.assertRaises(OSError):
            pm.save_weights(os.path.join(directory, "no-such-dir", "model.weights.h5"))
        with self.assertRaisesRegex(FileExistsError, "overwrite=False"):
            pm.save_weights(path, overwrite=False)
        self.assertAllClose(sd.allreduce(tf.ones([1]), op=sd.Sum, name="ckpt.healthy"), [SIZE])


class PipelineMixedPrecisionTest(tf.test.TestCase):
    """mixed_float16: float16 activations and gradients cross the cuts, the loss is scaled, steps skip together."""

    def setUp(self):
        super().setUp()
        keras.mixed_precision.set_global_policy("mixed_float16")
        self.addCleanup(keras.mixed_precision.set_global_policy, "float32")

    def test_gradients_and_fit_match_unpartitioned(self):
        x, y = data(16, seed=8)
        pm = PipelineModel(mlp, num_stages=SIZE, num_microbatches=2, verbose=False)
        boundary = pm._runner.in_dtypes if pm.pp_rank() else pm._runner.out_dtypes
        self.assertEqual(boundary, [tf.float16])
        pm.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
        self.assertIsInstance(pm.optimizer, keras.optimizers.LossScaleOptimizer)
        ref = mlp()
        ref.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
        scale = float(pm.optimizer.scale_loss(1.0))
        self.assertEqual(scale, 2.0 ** 15)
        with tf.GradientTape() as tape:
            want_loss = LOSS(y, ref(x))
            scaled = want_loss * scale
        want = [g / scale for g in tape.gradient(scaled, ref.trainable_variables)]
        loss, pairs = pm.pipeline_gradients(x, y)
        self.assertAllClose(float(loss), float(want_loss), rtol=1e-3)
        positions = [id(v) for v in pm.unpartitioned.trainable_variables]
        for variable, grad in pairs:
            self.assertAllClose(grad, want[positions.index(id(variable))], rtol=1e-2, atol=1e-3, msg=variable.path)
        got = pm.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0).history["loss"]
        expected = ref.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0).history["loss"]
        self.assertAllClose(got, expected, rtol=1e-2)
        for v, r in zip(pm.unpartitioned.variables, ref.variables):
            if v._value is not None:
                self.assertAllClose(v, r, rtol=1e-2, atol=1e-3, msg=v.path)

    def test_overflow_skips_the_step_on_every_rank(self):
        x, y = data(16, seed=8)
        pm = PipelineModel(mlp, num_stages=SIZE, num_microbatches=2, verbose=False)
        pm.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0 ** 40),
                   loss=LOSS)
        before = [v.numpy() for v in pm.stage_variables]
        pm.fit(x, y, batch_size=16, epochs=1, verbose=0)
        for v, b in zip(pm.stage_variables, before):
            self.assertAllEqual(v, b)
        scales = sd.allgather(tf.reshape(tf.convert_to_tensor(pm.optimizer.dynamic_scale), [1]), name="mp.scales")
        self.assertAllEqual(scales, [2.0 ** 39] * SIZE)
        # Only rank 1's gradients overflow: every rank still skips.
        grads = [tf.constant([1.0, float("inf") if RANK == 1 else 2.0])]
        self.assertTrue(np.isnan(pm._agree_finite(grads)[0].numpy()).all())
        self.assertAllEqual(pm._agree_finite([tf.ones([2])])[0], [1.0, 1.0])


class PipelineLossTermsTest(tf.test.TestCase):
    """Sample weights and regularization losses give the unpartitioned model's loss and gradients."""

    def test_sample_weights_match_unpartitioned(self):
        x, y = data(16, seed=9)
        # Uneven weights (some zero), so microbatches carry different total weight.
        w = np.random.default_rng(9).uniform(0.0, 2.0, 16).astype(np.float32) * (np.arange(16) % 5 != 0)
        # The replica count enters the weights of 'sum' and 'mean_with_sample_weight': the
        # last configuration has 2 replicas (with 4 ranks).
        for reduction, (stages, replicas) in [("sum_over_batch_size", CONFIGS[0]), ("sum", CONFIGS[-1]),
                                              ("mean_with_sample_weight", CONFIGS[-1])]:
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
            ref = mlp()
            with tf.GradientTape() as tape:
                want_loss = loss_fn(y, ref(x), sample_weight=w)
            want = tape.gradient(want_loss, ref.trainable_variables)
            pm = PipelineModel(mlp, num_stages=stages, num_microbatches=2, verbose=False)
            pm.compile(optimizer="sgd", loss=loss_fn)
            loss, pairs = pm.pipeline_gradients(x, y, sample_weight=w)
            assert_gradients_match(self, pm, loss, pairs, float(want_loss), want,
                                   f"{reduction}, {stages} stages x {replicas}")
        # fit with sample weights: the same loss history and weights as plain Keras.
        pm = PipelineModel(mlp, num_stages=SIZE, num_microbatches=2, verbose=False)
        pm.compile(optimizer=keras.optimizers.SGD(0.2), loss=LOSS)
        ref = mlp()
        ref.compile(optimizer=keras.optimizers.SGD(0.2), loss=LOSS)
        got = pm.fit(x, y, sample_weight=w, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
        expected = ref.fit(x, y, sample_weight=w, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
        self.assertAllClose(got, expected, rtol=1e-5)
        for v, r in zip(pm.unpartitioned.variables, ref.variables):
            if v._value is not None:
                self.assertAllClose(v, r, rtol=1e-5, atol=1e-6, msg=v.path)

    def test_regularization_losses_match_unpartitioned(self):
        x, y = data(16, seed=10)
        ref = regularized_model()
        with tf.GradientTape() as tape:
            want_loss = LOSS(y, ref(x))
            want_loss += tf.add_n(ref.losses)
        self.assertLen(ref.losses, 5)  # one activity + four weight regularizers (the tied kernel once)
        want = tape.gradient(want_loss, ref.trainable_variables)
        for stages, replicas in CONFIGS:
            pm = PipelineModel(regularized_model, num_stages=stages, num_microbatches=2, partition="uniform",
                               verbose=False)
            pm.compile(optimizer="sgd", loss=LOSS)
            loss, pairs = pm.pipeline_gradients(x, y)
            assert_gradients_match(self, pm, loss, pairs, float(want_loss), want, f"{stages} stages x {replicas}")
        # evaluate reports them too, as Keras does.
        ref.compile(loss=LOSS)
        self.assertAllClose(pm.evaluate(x, y, batch_size=16, verbose=0), ref.evaluate(x, y, batch_size=16, verbose=0),
                            rtol=1e-5)

    def test_unreduced_loss_is_refused_everywhere(self):
        pm = PipelineModel(mlp, num_stages=SIZE, num_microbatches=2, verbose=False)
        with self.assertRaisesRegex(ValueError, "reduction='none'|reduction=None"):
            pm.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                                        reduction=None))


class PipelineUnevenBatchTest(tf.test.TestCase):
    """Batches that do not divide by microbatches x replicas still give the unpartitioned model's loss and gradients."""

    def test_gradients_match_when_the_batch_does_not_divide(self):
        # 13 samples: 4 microbatches of 4, 3, 3, 3 (2 replicas: shards of 7 and 6, then 2, 2, 2, 1 and 2, 2, 1, 1).
        # 3 and 1: fewer samples than microbatches (2 replicas: one of them gets no sample of 1).
        for batch in (13, 3, 1):
            x, y = data(batch, seed=20 + batch)
            want_loss, want_grads = reference(mlp, x, y)
            for (stages, replicas), sched in zip(CONFIGS, ("1f1b", "gpipe")):
                pm = PipelineModel(mlp, num_stages=stages, num_microbatches=4, schedule=sched, verbose=False)
                pm.compile(optimizer="sgd", loss=LOSS)
                loss, pairs = pm.pipeline_gradients(x, y)
                assert_gradients_match(self, pm, loss, pairs, want_loss, want_grads,
                                       f"batch {batch}, {stages} stages x {replicas}, {sched}", rtol=1e-5, atol=1e-7)

    def test_loss_terms_weighted_by_microbatch_size(self):
        x, y = data(13, seed=22)
        w = np.random.default_rng(22).uniform(0.0, 2.0, 13).astype(np.float32) * (np.arange(13) % 4 != 0)
        stages, replicas = CONFIGS[-1]
        for reduction in ("sum_over_batch_size", "sum", "mean_with_sample_weight"):
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
            ref = mlp()
            with tf.GradientTape() as tape:
                want_loss = loss_fn(y, ref(x), sample_weight=w)
            want = tape.gradient(want_loss, ref.trainable_variables)
            pm = PipelineModel(mlp, num_stages=stages, num_microbatches=4, verbose=False)
            pm.compile(optimizer="sgd", loss=loss_fn)
            loss, pairs = pm.pipeline_gradients(x, y, sample_weight=w)
            assert_gradients_match(self, pm, loss, pairs, float(want_loss), want,
                                   f"{reduction}, {stages} stages x {replicas}", rtol=1e-5, atol=1e-7)
        # An activity regularizer is a mean over the batch: each microbatch's counts by its share too.
        ref = regularized_model()
        with tf.GradientTape() as tape:
            want_loss = LOSS(y, ref(x)) + tf.add_n(ref.losses)
        want = tape.gradient(want_loss, ref.trainable_variables)
        pm = PipelineModel(regularized_model, num_stages=stages, num_microbatches=4, partition="uniform", verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        loss, pairs = pm.pipeline_gradients(x, y)
        assert_gradients_match(self, pm, loss, pairs, float(want_loss), want, "regularized", rtol=1e-5, atol=1e-7)

    def test_fit_evaluate_predict_with_a_short_last_batch_match_unpartitioned(self):
        # 45 = 5 x 8 + 5: batches of 8 (3 microbatches of 3, 3, 2) and a last one of 5 (2, 2, 1).
        x, y = data(45, seed=23)
        for stages, replicas in CONFIGS:
            where = f"{stages} stages x {replicas}"
            pm = PipelineModel(mlp, num_stages=stages, num_microbatches=3, verbose=False)
            pm.compile(optimizer=keras.optimizers.SGD(0.2), loss=LOSS, metrics=["accuracy"])
            ref = mlp()
            ref.compile(optimizer=keras.optimizers.SGD(0.2), loss=LOSS, metrics=["accuracy"])
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
            got = pm.fit(dataset, epochs=3, shuffle=False, verbose=0).history
            expected = ref.fit(dataset, epochs=3, shuffle=False, verbose=0).history
            self.assertAllClose(got["loss"], expected["loss"], rtol=1e-5, msg=where)
            self.assertAllClose(got["accuracy"], expected["accuracy"], msg=where)
            for v, r in zip(pm.unpartitioned.variables, ref.variables):
                if v._value is not None:
                    self.assertAllClose(v, r, rtol=1e-5, atol=1e-6, msg=f"{where}: {v.path}")
            # 45 = 6 x 7 + 3: the last batch has as many samples as microbatches (fewer per replica).
            self.assertAllClose(pm.evaluate(x, y, batch_size=7, verbose=0), ref.evaluate(x, y, batch_size=7, verbose=0),
                                rtol=1e-5, msg=where)
            self.assertAllClose(pm.predict(x, batch_size=7, verbose=0), ref.predict(x, batch_size=7, verbose=0),
                                rtol=1e-5, atol=1e-6, msg=where)


class PipelineCompiledStepTest(tf.test.TestCase):
    """A step is one tf.function: traced once per batch shape, its gradient sync bucketed inside it."""

    @at_two_ranks_only("each rank traces its own step function; the stage layouts are compared at 4 ranks below")
    def test_one_trace_per_batch_shape_and_mode(self):
        # 45 = 5 x 8 + 5: training traces batches of 8 and of 5, evaluation the same two again.
        x, y = data(45, seed=30)
        pm = PipelineModel(mlp, num_stages=CONFIGS[-1][0], num_microbatches=3, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        pm.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
        self.assertEqual(pm._runner._step_fn.experimental_get_tracing_count(), 2)
        pm.pipeline_gradients(x[:8], y[:8])
        self.assertEqual(pm._runner._step_fn.experimental_get_tracing_count(), 2)
        pm.evaluate(x, y, batch_size=8, verbose=0)
        pm.evaluate(x, y, batch_size=8, verbose=0)
        self.assertEqual(pm._runner._step_fn.experimental_get_tracing_count(), 4)

    def test_gradients_match_with_one_bucket_per_variable(self):
        # A tiny bucket cap gives every replica-sum its own request inside the step.
        x, y = data(16, seed=31)
        want_loss, want_grads = reference(mlp, x, y)
        os.environ["SMDIST_BUCKET_CAP_MB"] = "0.000001"
        try:
            for stages, replicas in CONFIGS:
                pm = PipelineModel(mlp, num_stages=stages, num_microbatches=2, verbose=False)
                pm.compile(optimizer="sgd", loss=LOSS)
                loss, pairs = pm.pipeline_gradients(x, y)
                assert_gradients_match(self, pm, loss, pairs, want_loss, want_grads,
                                       f"{stages} stages x {replicas}, a bucket per variable")
        finally:
            del os.environ["SMDIST_BUCKET_CAP_MB"]


class PipelineErrorTest(tf.test.TestCase):
    """Each mistake raises the same clear error on every rank, and the job goes on."""

    def test_bad_inputs_raise_everywhere(self):
        one_layer = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
        with self.assertRaisesRegex(ValueError, "more than the model's 1 layers"):
            PipelineModel(one_layer, num_stages=SIZE, num_microbatches=2, verbose=False)
        with self.assertRaisesRegex(ValueError, "not a multiple of num_stages=3"):
            PipelineModel(mlp(), num_stages=3, num_microbatches=2, verbose=False)
        with self.assertRaisesRegex(ValueError, "unknown schedule"):
            PipelineModel(mlp(), num_stages=SIZE, num_microbatches=2, schedule="zigzag", verbose=False)
        pm = PipelineModel(mlp(), num_stages=2, num_microbatches=4, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        # Different data on different ranks is caught before it corrupts training.
        x16, y16 = data(16, seed=RANK)
        pm._verify_batch = True
        with self.assertRaisesRegex(ValueError, "ranks were given different batches"):
            pm.pipeline_gradients(x16, y16)
        self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name="pipeline.healthy"), [SIZE, SIZE])

    def test_rank_helpers(self):
        pm = PipelineModel(mlp(), num_stages=2, num_microbatches=1, verbose=False)
        self.assertEqual(pipeline.pp_size(), 2)
        self.assertEqual(pipeline.dp_size(), SIZE // 2)
        self.assertEqual(pipeline.pp_rank(), RANK % 2)
        self.assertEqual(pipeline.dp_rank(), RANK // 2)
        self.assertIn(RANK, pipeline.pp_group())
        self.assertEqual(pipeline.dp_group(), list(range(RANK % 2, SIZE, 2)))
        self.assertEqual(pm.pp_rank(), pipeline.pp_rank())


class PipelineExportTest(tf.test.TestCase):
    """What leaves a pipeline: the whole model's weights on every rank, progress output on rank 0, save()'s error."""

    def test_gather_weights_returns_the_whole_model_on_every_rank(self):
        x, y = data(16, seed=11)
        pm = PipelineModel(mlp, num_stages=2, num_microbatches=2, verbose=False)
        pm.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
        pm.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        expected = pm.predict(x, batch_size=8, verbose=0)
        weights = pm.gather_weights()
        plain = mlp(seed=99)
        self.assertEqual([w.shape for w in weights], [w.shape for w in plain.get_weights()])
        plain.set_weights(weights)
        self.assertAllClose(plain.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
        mine = tf.constant([float(np.sum(w, dtype=np.float64)) for w in weights], tf.float64)
        everyone = sd.allgather(mine[None], name="export.gathered").numpy()
        for r in range(SIZE):
            self.assertAllEqual(everyone[r], mine.numpy(), msg=f"rank {r} gathered other weights")

    def _fit_output(self, **options) -> str:
        # As in a fresh process: a DataParallelStrategy made earlier in this job (another suite's) turns
        # Keras' interactive logging off on the ranks other than 0 for the rest of the process.
        if not keras.config.is_interactive_logging_enabled():
            keras.config.enable_interactive_logging()
            self.addCleanup(keras.config.disable_interactive_logging)
        x, y = data(16, seed=12)
        pm = PipelineModel(mlp, num_stages=2, num_microbatches=2, verbose=False, **options)
        pm.compile(optimizer="sgd", loss=LOSS)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            pm.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=2)
            pm.evaluate(x, y, batch_size=8, verbose=1)
        self.assertTrue(keras.config.is_interactive_logging_enabled(), "the setting was not restored")
        return printed.getvalue()

    @at_two_ranks_only("rank 0 prints and every other rank keeps quiet, however many there are")
    def test_progress_is_printed_on_rank_zero_only_by_default(self):
        printed = self._fit_output()
        if RANK == 0:
            self.assertIn("Epoch 2/2", printed)
            self.assertIn("loss:", printed)
        else:
            self.assertEqual(printed, "")
        self.assertIn("Epoch 2/2", self._fit_output(progress_on_rank_zero_only=False))

    def test_save_names_the_alternatives_and_the_gathered_model_saves(self):
        x, _ = data(16, seed=13)
        pm = PipelineModel(mlp, num_stages=2, num_microbatches=2, verbose=False)
        pm.compile(optimizer="sgd", loss=LOSS)
        directory = tempfile.mkdtemp(prefix="pipeline-save-")
        with self.assertRaisesRegex(NotImplementedError, r"save_weights\(.*gather_weights\(\)"):
            pm.save(os.path.join(directory, "model.keras"))
        self.assertFalse(os.path.exists(os.path.join(directory, "model.keras")))
        expected = pm.predict(x, batch_size=8, verbose=0)
        pm.gather_weights()
        pm.unpartitioned.save(os.path.join(directory, "whole.keras"))
        loaded = keras.models.load_model(os.path.join(directory, "whole.keras"))
        self.assertAllClose(loaded.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
