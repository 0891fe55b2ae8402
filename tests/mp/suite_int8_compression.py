"""Compression.int8: results within the documented error bound of the exact sum, equal on every rank.

Run on every rank by tests/test_int8_compression_multiprocess.py (in the shared plain job).
The bound (docs/compression.md): per element, B * ((1 + 1/254)**n - 1), where B sums over the ranks
each rank's largest magnitude in the element's block of 256 (after prescaling), n is the rank count;
Average divides it by n and postscale multiplies it.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk
from tests.mp import sync_assertions

RANK, SIZE = sd.rank(), sd.size()
BLOCK = 256


def rank_inputs(rank: int, count: int, seed: int) -> np.ndarray:
    """Normal values whose scale changes from block to block, so blocks get different scales."""
    rng = np.random.default_rng(seed * 131 + rank)
    scales = 10.0 ** rng.uniform(-3, 3, size=(count + BLOCK - 1) // BLOCK)
    return (rng.normal(size=count) * np.repeat(scales, BLOCK)[:count]).astype(np.float32)


def bits(values: np.ndarray) -> np.ndarray:
    """The values' bit patterns as integers, to compare ranks' results exactly (NaN too)."""
    return values.view({2: np.uint16, 4: np.int32, 8: np.int64}[values.dtype.itemsize])


def error_bound(inputs: list[np.ndarray], prescale: float = 1.0) -> np.ndarray:
    """Per element: the bound above, plus float32 rounding of the sums and scales (n * B * 2**-22)."""
    count = inputs[0].size
    blocks = (count + BLOCK - 1) // BLOCK
    padded = [np.pad(np.abs(x.astype(np.float64) * prescale), (0, blocks * BLOCK - count)) for x in inputs]
    b = sum(p.reshape(blocks, BLOCK).max(axis=1) for p in padded)
    n = len(inputs)
    per_block = b * ((1.0 + 1.0 / 254.0) ** n - 1.0) + n * b * 2.0 ** -22
    return np.repeat(per_block, BLOCK)[:count]


class Int8CompressionTest(sync_assertions.SyncAssertions):
    def _check(self, inputs: list[np.ndarray], dtype: tf.DType, op: int, name: str,
               prescale: float = 1.0, postscale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """Allreduces ``inputs[RANK]`` as ``dtype``; checks the bound and equality across ranks.

        Returns:
            The result and its error against the exact (float64) reduction.
        """
        out = sd.allreduce(tf.constant(inputs[RANK], dtype), op=op, compression=sd.Compression.int8,
                           prescale_factor=prescale, postscale_factor=postscale, name=name)
        self.assertEqual(out.dtype, dtype)
        divisor = SIZE if op == sd.Average else 1
        exact = sum(x.astype(np.float64) * prescale for x in inputs) * postscale / divisor
        bound = error_bound(inputs, prescale) * postscale / divisor
        got = out.numpy().astype(np.float64)
        if dtype in (tf.float16, tf.bfloat16):  # the result is rounded to the output's type once more
            bound = bound + (np.abs(exact) + bound) * (2.0 ** -11 if dtype == tf.float16 else 2.0 ** -8)
        error = np.abs(got - exact)
        worst = int(np.argmax(error - bound))
        self.assertTrue((error <= bound).all(), f"{name}: element {worst} off by {error[worst]}, bound {bound[worst]}")
        self.assert_identical_on_all_ranks(bits(out.numpy()))
        return got, error

    def test_sum_and_average_within_the_bound_for_sizes_off_the_block_and_chunk_sizes(self):
        # 2**22 + 300 spans two of the ring's segments; the others are off the block (256) and
        # chunk (blocks split over the ranks) sizes, or leave some ranks' chunks empty.
        for count in [1, 255, 256, 257, 3 * 256 + 1, 70001, 2 ** 22 + 300]:
            inputs = [rank_inputs(r, count, seed=count) for r in range(SIZE)]
            for op in [sd.Sum, sd.Average] if count < 2 ** 20 else [sd.Sum]:  # Average: scaling, shown small
                _, error = self._check(inputs, tf.float32, op, f"int8.{count}.{op}")
            if count > 256:
                # Really quantized: an uncompressed sum would be within float32 rounding.
                self.assertGreater(float(np.max(error / error_bound(inputs))), 1e-3)

    def test_every_float_dtype_and_scale_factors(self):
        for dtype in [tf.float64, tf.float16, tf.bfloat16, tf.float32]:
            # Inputs exact in the dtype, as the reference must see what was sent.
            inputs = [tf.cast(rank_inputs(r, 1000, seed=7) / 1000.0, dtype).numpy().astype(np.float32)
                      for r in range(SIZE)]
            self._check(inputs, dtype, sd.Sum, f"int8.dtype.{dtype.name}")
            self._check(inputs, dtype, sd.Average, f"int8.scaled.{dtype.name}", prescale=0.5, postscale=3.0)

    def test_zeros_stay_exact(self):
        for count in [5, 700]:
            zeros = [np.zeros(count, np.float32) for _ in range(SIZE)]
            out = sd.allreduce(tf.zeros([count]), op=sd.Sum, compression=sd.Compression.int8, name=f"int8.zeros.{count}")
            self.assertAllEqual(out, zeros[0])
        # Zeros on some ranks only: blocks of all zeros on one rank cost nothing.
        inputs = [rank_inputs(r, 600, seed=3) if r == SIZE - 1 else np.zeros(600, np.float32) for r in range(SIZE)]
        self._check(inputs, tf.float32, sd.Sum, "int8.some_zeros")

    def test_one_huge_outlier_costs_precision_in_its_block_only(self):
        count = 4 * BLOCK
        inputs = [np.random.default_rng(r).uniform(-1.0, 1.0, count).astype(np.float32) for r in range(SIZE)]
        inputs[0][BLOCK + 5] = 1.0e6
        out, error = self._check(inputs, tf.float32, sd.Sum, "int8.outlier")
        # The outlier's block is quantized in steps of 1e6/127 once rank 0's values are in it, so its
        # other sums (|sum| <= size) come back as 0; the other blocks keep steps of about size/127.
        self.assertAllEqual(np.delete(out[BLOCK:2 * BLOCK], 5), np.zeros(BLOCK - 1))
        self.assertLess(float(np.delete(error, np.s_[BLOCK:2 * BLOCK]).max()), 0.5)

    def test_non_finite_values_make_their_block_nan(self):
        x = np.ones(3 * BLOCK, np.float32)
        if RANK == 0:
            x[BLOCK + 1] = np.inf
        out = sd.allreduce(tf.constant(x), op=sd.Sum, compression=sd.Compression.int8, name="int8.inf").numpy()
        self.assertTrue(np.isnan(out[BLOCK:2 * BLOCK]).all())
        self.assertAllClose(np.delete(out, np.s_[BLOCK:2 * BLOCK]), np.full(2 * BLOCK, SIZE, np.float32))

    def test_fused_tensors_in_a_function_and_integers_pass_through(self):
        # Fused into one response: blocks run across tensor boundaries, so the bound takes the largest
        # magnitude of all of them; integers are reduced exactly, uncompressed.
        a = [rank_inputs(r, 300, seed=11) for r in range(SIZE)]
        b = [rank_inputs(r, 1000, seed=12) for r in range(SIZE)]
        ints = np.arange(10, dtype=np.int32) * (RANK + 1)

        @tf.function
        def step(x, y, z):
            return sd.grouped_allreduce([x, y, z], op=sd.Sum, compression=sd.Compression.int8, name="int8.group")

        outs = step(tf.constant(a[RANK]), tf.constant(b[RANK]), tf.constant(ints))
        largest = sum(max(np.abs(a[r]).max(), np.abs(b[r]).max()) for r in range(SIZE))
        bound = largest * ((1 + 1 / 254) ** SIZE - 1) * (1 + 1e-5)
        self.assertLessEqual(float(np.abs(outs[0].numpy() - np.sum(a, axis=0, dtype=np.float64)).max()), bound)
        self.assertLessEqual(float(np.abs(outs[1].numpy() - np.sum(b, axis=0, dtype=np.float64)).max()), bound)
        self.assertAllEqual(outs[2], np.arange(10) * SIZE * (SIZE + 1) // 2)

    def test_xla_compiled_call_gives_the_same_bits(self):
        x = tf.constant(rank_inputs(RANK, 1000, seed=21))
        eager = sd.allreduce(x, op=sd.Average, compression=sd.Compression.int8, name="int8.eager")
        compiled = tf.function(jit_compile=True)(
            lambda t: sd.allreduce(t, op=sd.Average, compression=sd.Compression.int8, name="int8.xla"))(x)
        self.assertAllEqual(bits(compiled.numpy()), bits(eager.numpy()))

    def test_min_max_product_fail_on_every_rank_and_the_engine_goes_on(self):
        for op in [sd.Min, sd.Max, sd.Product]:
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "Compression.int8 reduces with Sum or Average"):
                sd.allreduce(tf.ones([4]), op=op, compression=sd.Compression.int8, name=f"int8.refused.{op}")
        self.assert_engine_healthy()

    def test_tape_and_distributed_optimizer_train_and_keep_ranks_identical(self):
        rng = np.random.default_rng(5)
        x_all = rng.normal(size=(32 * SIZE, 8)).astype(np.float32)
        y_all = (x_all @ rng.normal(size=(8, 1))).astype(np.float32)
        mine = slice(RANK * 32, (RANK + 1) * 32)
        x, y = tf.constant(x_all[mine]), tf.constant(y_all[mine])
        for how in ["tape", "optimizer"]:
            keras.utils.set_random_seed(1 + RANK)  # different on each rank until the broadcast
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
            sd.broadcast_variables(model.variables, root_rank=0)
            optimizer = keras.optimizers.SGD(0.1)
            if how == "optimizer":
                optimizer = sk.DistributedOptimizer(optimizer, compression=sd.Compression.int8)

            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - y))
                if how == "tape":
                    tape = sd.DistributedGradientTape(tape, compression=sd.Compression.int8)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return sd.allreduce(loss, name=f"int8.loss.{how}")

            losses = [float(step()) for _ in range(8)]
            self.assertLess(losses[-1], 0.5 * losses[0], f"{how}: {losses}")
            self.assert_identical_on_all_ranks(bits(np.concatenate([w.ravel() for w in model.get_weights()])))


if __name__ == "__main__":
    tf.test.main()
