"""Gradient buckets overlap the backward pass and change no result: the tape, DistributedOptimizer, the strategy.

Run on every rank by tests/test_gradient_buckets_multiprocess.py, at 2 and 4 ranks. The bucket
size is read when a step is traced, so each test sets ``SMDIST_BUCKET_CAP_MB`` in the rank's
own environment before tracing.
"""

from __future__ import annotations

import json
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk
from smdist_tf.buckets import BUCKET_CAP_VARIABLE
from tests.mp.rank_counts import at_two_ranks_only
from tests.mp.sync_assertions import SyncAssertions

HANG_S = 150  # a test still running after this is hung (each takes seconds)
WIDTH = 64
BURN_MATMULS = 120  # about 0.15 s on the 2-core CI machine, more when it is busy


def make_model(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((WIDTH,))] + [keras.layers.Dense(WIDTH, activation="tanh") for _ in range(4)]
                            + [keras.layers.Dense(1)])


def rank_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(sd.rank())
    x = rng.normal(size=(64, WIDTH)).astype(np.float32)
    return x, x[:, :1] * 2.0


def allreduce_ops(concrete: tf.types.experimental.ConcreteFunction) -> int:
    """How many allreduce requests a traced step issues (a grouped allreduce is one op)."""
    return sum(op.type == "SmdistAllreduce" for op in concrete.graph.get_operations())


def flat(arrays: list) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


@tf.custom_gradient
def slow_backward(x: tf.Tensor):
    """Identity whose gradient first burns BURN_MATMULS matrix products: the layers before it get theirs late.

    Stateless compute on ``dy`` (nothing TensorFlow can fold away or order by state),
    like the backward pass of a large layer.
    """

    def grad(dy):
        m = tf.tile(dy[:8, :WIDTH], [64, 8])
        for _ in range(BURN_MATMULS):
            m = tf.tanh(tf.matmul(m, m) * 0.01)
        return dy + 0.0 * tf.reduce_sum(m)

    return tf.identity(x), grad


class GradientBucketsTest(SyncAssertions):
    def setUp(self):
        super().setUp()
        self.addCleanup(os.environ.pop, BUCKET_CAP_VARIABLE, None)

    def tape_step(self, model: keras.Model, **tape_args):
        x, y = rank_data()

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            return sd.DistributedGradientTape(tape, **tape_args).gradient(loss, model.trainable_variables)

        return step

    def test_tape_buckets_change_no_result(self):
        model = make_model()
        one_request = self.tape_step(model, num_groups=1)
        os.environ[BUCKET_CAP_VARIABLE] = "0.02"  # 20 KiB: a 64x64 kernel (16 KiB) and a bias or two per bucket
        bucketed = self.tape_step(model)
        self.assertEqual(allreduce_ops(one_request.get_concrete_function()), 1)
        self.assertEqual(allreduce_ops(bucketed.get_concrete_function()), 4)
        expected, got = one_request(), bucketed()
        for e, g in zip(expected, got):
            self.assertAllClose(g, e, rtol=1e-6, atol=1e-7)
        self.assert_identical_on_all_ranks(flat(got))

    @at_two_ranks_only("when a rank's buckets leave depends on its own backward pass, not on the other ranks")
    def test_buckets_travel_while_the_backward_pass_still_runs(self):
        # The first layer's gradients come well after the others'. Bucketed, the others'
        # allreduces finish before that; in one request everything waits for them.
        template = os.path.join(sd.broadcast_object(tempfile.mkdtemp() if sd.rank() == 0 else None),
                                "timeline.{rank}.json")
        inputs = keras.Input((WIDTH,))
        first = keras.layers.Dense(WIDTH, activation="tanh")
        hidden = keras.layers.Lambda(slow_backward)(first(inputs))
        outputs = keras.layers.Dense(1)(keras.layers.Dense(WIDTH, activation="tanh")(hidden))
        model = keras.Model(inputs, outputs)
        # 17000 bytes: the last two layers (16900) in one bucket, the first layer (16640) in another.
        os.environ[BUCKET_CAP_VARIABLE] = str(17000 / 2**20)
        gaps = {}
        for case, tape_args in [("bucketed", {}), ("one request", {"num_groups": 1})]:
            step = self.tape_step(model, **tape_args)
            step()  # traced outside the timeline
            sd.barrier()
            path = template.replace(".json", f".{case.replace(' ', '_')}.json")
            sd.start_timeline(path)
            step()
            sd.stop_timeline()
            gaps[case] = self.late_negotiation_gap(path.format(rank=sd.rank()))
        self.assertGreater(gaps["bucketed"], 0.05, gaps)
        self.assertLess(gaps["one request"], 0.01, gaps)

    @staticmethod
    def late_negotiation_gap(path: str) -> float:
        """Seconds from the first allreduce's end to the last negotiation's start."""
        with open(path) as f:
            events = [e for e in json.load(f) if e.get("ph") == "X"]
        first_end = min(e["ts"] + e["dur"] for e in events if e["name"] == "ALLREDUCE")
        last_negotiation = max(e["ts"] for e in events if e["name"] == "NEGOTIATE")
        return (last_negotiation - first_end) / 1e6

    def fit_weights(self, cap_mb: str, strategy: bool) -> np.ndarray:
        os.environ[BUCKET_CAP_VARIABLE] = cap_mb
        x, y = rank_data()
        if strategy:
            with sd.DataParallelStrategy().scope():
                model = make_model()
                model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        else:
            model = make_model()
            model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return flat(model.get_weights())

    @at_two_ranks_only("how a rank's gradients are split into buckets does not depend on the other ranks")
    def test_fit_results_do_not_depend_on_the_bucket_size(self):
        for strategy in (False, True):
            with self.subTest(strategy=strategy):
                one_bucket = self.fit_weights("64", strategy)
                many_buckets = self.fit_weights("0.02", strategy)
                self.assertAllClose(many_buckets, one_bucket, rtol=1e-5, atol=1e-6)
                self.assert_identical_on_all_ranks(many_buckets)

    def test_communication_options_set_the_strategy_bucket_size(self):
        strategy = sd.DataParallelStrategy()
        values = [tf.fill([256], float(sd.rank() + i)) for i in range(4)]  # 1 KiB each

        def all_reduce(bytes_per_pack: int):
            options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=bytes_per_pack)

            @tf.function
            def run():
                return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, values, options=options))

            return run

        for bytes_per_pack, requests in [(1024, 4), (2048, 2), (0, 1)]:
            with self.subTest(bytes_per_pack=bytes_per_pack):
                run = all_reduce(bytes_per_pack)
                self.assertEqual(allreduce_ops(run.get_concrete_function()), requests)
                total = sum(range(sd.size()))
                for i, reduced in enumerate(strategy.experimental_local_results(run())[0]):
                    self.assertAllClose(reduced, np.full([256], total + i * sd.size()))



if __name__ == "__main__":
    tf.test.main()
