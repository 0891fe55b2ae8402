"""Every error path fails on every rank (never a hang), and the engine keeps working afterwards.

Run on every rank by tests/test_errors_multiprocess.py. The tests that stop the
engine restart it (shutdown() then init() reads the environment again).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.engine_restart import restart_engine
from tests.mp.collective_expectations import all_rank_values, expected_reduction

RANK, SIZE = sd.rank(), sd.size()
LAST = SIZE - 1


class CapturedStderr:
    """Captures file descriptor 2, where the C++ engine logs."""

    def __enter__(self):
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()


class MismatchTest(tf.test.TestCase):
    """A disagreement between ranks raises FailedPreconditionError on all of them, naming the tensor;
    a bad input on one rank raises InvalidArgumentError on all of them (Horovod's classes)."""

    def assert_fails_everywhere(self, fn, *patterns, error=tf.errors.FailedPreconditionError):
        with self.assertRaises(error) as ctx:
            fn()
        self.assertIs(type(ctx.exception), error)
        for pattern in patterns:
            self.assertRegex(ctx.exception.message, pattern)
        # The engine is still healthy afterwards.
        self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name=f"healthy.{self.id()}"), [SIZE, SIZE])

    def test_shape(self):
        self.assert_fails_everywhere(
            lambda: sd.allreduce(tf.ones([2, RANK + 1]), name="m.shape"), "mismatched shapes", "'m.shape'", r"\[2, 1\]", r"\[2, 2\]"
        )

    def test_unnamed_eager_calls_are_numbered_per_kind_in_call_order(self):
        # The kernel numbers unnamed eager calls; the number shows in the error of a mismatched one.
        def mismatched_number():
            with self.assertRaises(tf.errors.FailedPreconditionError) as ctx:
                sd.allreduce(tf.ones([RANK + 1]))
            match = re.search(r"'allreduce\.noname\.(\d+)'", ctx.exception.message)
            self.assertIsNotNone(match, ctx.exception.message)
            return int(match.group(1))

        first = mismatched_number()
        # Different kernels (Sum, Average, a group of two) share one counter; other kinds have their own.
        self.assertAllEqual(sd.allreduce(tf.fill([3], float(RANK)), op=sd.Sum), np.full([3], SIZE * (SIZE - 1) / 2))
        self.assertAllClose(sd.allreduce(tf.fill([2], float(RANK)), op=sd.Average), np.full([2], (SIZE - 1) / 2))
        outs = sd.grouped_allreduce([tf.ones([2]), tf.ones([5], tf.float64)], op=sd.Sum)
        self.assertAllEqual(outs[1], np.full([5], float(SIZE)))
        self.assertAllEqual(sd.allgather(tf.fill([1], RANK)), np.arange(SIZE))
        sd.barrier()
        self.assertEqual(mismatched_number(), first + 4)

    def test_dtype(self):
        dtype = tf.float32 if RANK == 0 else tf.float64
        self.assert_fails_everywhere(lambda: sd.allreduce(tf.ones([2], dtype), name="m.dtype"), "mismatched dtypes", "'m.dtype'", "float32", "float64")

    def test_tensor_rank(self):
        shape = [4] if RANK == 0 else [2, 2]
        self.assert_fails_everywhere(lambda: sd.allreduce(tf.ones(shape), name="m.ndim"), "number of dimensions", "'m.ndim'")

    def test_reduce_op(self):
        op = sd.Sum if RANK == 0 else sd.Max
        self.assert_fails_everywhere(lambda: sd.allreduce(tf.ones([2]), op=op, name="m.op"), "mismatched reduce ops", "Sum", "Max")

    def test_scale_factors(self):
        self.assert_fails_everywhere(
            lambda: sd.allreduce(tf.ones([2]), op=sd.Sum, prescale_factor=1.0 + RANK, name="m.scale"), "prescale/postscale"
        )
        # Factors that differ in the last bit are told apart in the message too.
        self.assert_fails_everywhere(
            lambda: sd.allreduce(tf.ones([2]), op=sd.Sum, prescale_factor=1.0 + min(RANK, 1) * 2.0 ** -23, name="m.scale.bit"),
            "prescale/postscale", r"rank 0 has 1/1,", r"has 1\.0000001192092896/1",
        )

    def test_compression(self):
        compression = sd.Compression.fp16 if RANK == 0 else sd.Compression.none
        self.assert_fails_everywhere(
            lambda: sd.allreduce(tf.ones([2]), op=sd.Sum, compression=compression, name="m.compression"),
            "mismatched compression", "fp16", "none",
        )

    def test_root_rank(self):
        self.assert_fails_everywhere(lambda: sd.broadcast(tf.ones([2]), root_rank=RANK, name="m.root"), "mismatched root ranks", "'m.root'")

    def test_root_rank_out_of_range(self):
        self.assert_fails_everywhere(lambda: sd.broadcast(tf.ones([2]), root_rank=SIZE, name="m.badroot"), "out of range",
                                     error=tf.errors.InvalidArgumentError)

    def test_collective_type(self):
        def call():
            if RANK == 0:
                return sd.allreduce(tf.ones([2]), name="m.type")
            return sd.allgather(tf.ones([2]), name="m.type")

        self.assert_fails_everywhere(call, "mismatched operations", "allreduce", "allgather")

    def test_allgather_trailing_dimensions(self):
        self.assert_fails_everywhere(lambda: sd.allgather(tf.ones([2, RANK + 1]), name="m.gather"), "beyond the first dimension", "'m.gather'")

    def test_allgather_tensor_rank(self):
        shape = [2, 2] if RANK == 0 else [2, 2, 1]
        self.assert_fails_everywhere(lambda: sd.allgather(tf.ones(shape), name="m.gather_rank"), "number of dimensions")

    def test_alltoall_bad_splits_on_one_rank(self):
        splits = [1] * SIZE if RANK != LAST else [SIZE + 5] + [0] * (SIZE - 1)
        self.assert_fails_everywhere(
            lambda: sd.alltoall(tf.ones([SIZE, 2]), splits=splits, name="m.splits"), f"rank {LAST}", "splits sum to",
            error=tf.errors.InvalidArgumentError,
        )

    def test_alltoall_indivisible(self):
        self.assert_fails_everywhere(lambda: sd.alltoall(tf.ones([SIZE + 1]), name="m.indiv"), "does not divide evenly",
                                     error=tf.errors.InvalidArgumentError)

    def test_reducescatter_scalar(self):
        self.assert_fails_everywhere(lambda: sd.reducescatter(tf.constant(1.0), name="m.rs"), "rank >= 1",
                                     error=tf.errors.InvalidArgumentError)

    def test_mismatch_inside_tf_function(self):
        fn = tf.function(lambda x: sd.allreduce(x, name="m.graph"))
        self.assert_fails_everywhere(lambda: fn(tf.ones([RANK + 1])), "mismatched shapes", "'m.graph'")

    def test_mismatch_in_group_fails_whole_op(self):
        tensors = [tf.ones([2]), tf.ones([RANK + 3])]
        self.assert_fails_everywhere(lambda: sd.grouped_allreduce(tensors, name="m.group"), r"'m\.group\.1'")


class ResponseCacheTest(tf.test.TestCase):
    """Repeated collectives are negotiated through the bit-vector cache; changes must still be caught."""

    def test_cached_collective_with_new_shape_on_one_rank_fails_everywhere(self):
        for _ in range(3):
            self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name="cache.x"), [SIZE] * 2)
        shape = [3] if RANK == 0 else [2]
        with self.assertRaisesRegex(tf.errors.FailedPreconditionError, "mismatched shapes.*'cache.x'"):
            sd.allreduce(tf.ones(shape), op=sd.Sum, name="cache.x")
        self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name="cache.x"), [SIZE] * 2)

    def test_cached_collective_changed_on_every_rank_renegotiates(self):
        for n in [4, 4, 6, 6, 1]:
            self.assertAllClose(sd.allreduce(tf.ones([n]), op=sd.Sum, name="cache.y"), [SIZE] * n)
        for rows in [1, 2, 2]:  # allgather with a first dimension that changes per rank
            out = sd.allgather(tf.ones([rows + RANK, 2]), name="cache.gather")
            self.assertEqual(out.shape[0], sum(rows + r for r in range(SIZE)))

    def test_stall_of_cached_collective_is_reported(self):
        restart_engine(SMDIST_STALL_CHECK_TIME="1")
        try:
            for _ in range(2):
                sd.allreduce(tf.ones([1]), name="cache.late")
            with CapturedStderr() as captured:
                if RANK == LAST:
                    time.sleep(2.5)
                sd.allreduce(tf.ones([1]), name="cache.late")
            if RANK == 0:
                self.assertIn("cache.late", captured.text)
                self.assertRegex(captured.text, rf"not by rank\(s\) \[{LAST}\]")
        finally:
            restart_engine(SMDIST_STALL_CHECK_TIME="")


class LocalMisuseTest(tf.test.TestCase):
    def test_duplicate_name_in_flight(self):
        # Rank 0 has 'dup' pending (the other ranks submit it later); a second
        # 'dup' on rank 0 is refused at once instead of being mixed up.
        result = {}
        if RANK == 0:
            t = threading.Thread(target=lambda: result.setdefault("v", sd.allreduce(tf.ones([1]), op=sd.Sum, name="dup")))
            t.start()
            time.sleep(0.3)
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "already in flight"):
                sd.allreduce(tf.ones([1]), name="dup")
            sd.barrier(name="dup.barrier")
            t.join(timeout=60)
            self.assertAllClose(result["v"], [SIZE])
        else:
            sd.barrier(name="dup.barrier")
            self.assertAllClose(sd.allreduce(tf.ones([1]), op=sd.Sum, name="dup"), [SIZE])


class StallTest(tf.test.TestCase):
    def test_stall_warning_names_tensor_and_missing_ranks(self):
        restart_engine(SMDIST_STALL_CHECK_TIME="1")
        try:
            with CapturedStderr() as captured:
                if RANK == LAST:
                    time.sleep(2.5)
                sd.allreduce(tf.ones([1]), name="late.tensor")
            if RANK == 0:  # the coordinator reports
                self.assertIn("late.tensor", captured.text)
                self.assertRegex(captured.text, rf"not by rank\(s\) \[{LAST}\]")
        finally:
            restart_engine(SMDIST_STALL_CHECK_TIME="")

    def test_stall_shutdown_fails_every_rank(self):
        restart_engine(SMDIST_STALL_SHUTDOWN_TIME="2")
        try:
            name = "stall.only_rank0" if RANK == 0 else "stall.other_ranks"
            start = time.time()
            with self.assertRaisesRegex(tf.errors.AbortedError, "stall shutdown") as ctx:
                sd.allreduce(tf.ones([1]), name=name)
            self.assertLess(time.time() - start, 30)
            for stalled in ["stall.only_rank0", "stall.other_ranks"]:
                self.assertIn(stalled, ctx.exception.message)
            # The engine is stopped: later collectives fail at once with the same reason.
            with self.assertRaisesRegex(tf.errors.AbortedError, "stall"):
                sd.allreduce(tf.ones([1]), name="after.stall")
        finally:
            restart_engine(SMDIST_STALL_SHUTDOWN_TIME="")
        self.assertAllClose(sd.allreduce(tf.ones([1]), op=sd.Sum, name="stall.recovered"), [SIZE])


class ShutdownTest(tf.test.TestCase):
    def test_shutdown_on_one_rank_fails_pending_collectives_elsewhere(self):
        if RANK == 0:
            time.sleep(0.5)
            sd.shutdown()
            with self.assertRaisesRegex(ValueError, "not been initialized"):
                sd.allreduce(tf.ones([1]))
        else:
            with self.assertRaisesRegex(tf.errors.AbortedError, "shut down"):
                sd.allreduce(tf.ones([1]), name="never.on.rank0")
            # Still stopped: later collectives fail at once with the same reason.
            with self.assertRaisesRegex(tf.errors.AbortedError, r"shutdown\(\) called on rank 0"):
                sd.allreduce(tf.ones([1]), name="after.remote.shutdown")
        # init() restarts a stopped engine without an explicit shutdown().
        sd.init()
        self.assertAllClose(sd.allreduce(tf.ones([1]), op=sd.Sum, name="shutdown.recovered"), [SIZE])


class FusionBoundaryTest(tf.test.TestCase):
    def test_tensors_larger_than_threshold_and_mixed_dtypes(self):
        restart_engine(SMDIST_FUSION_THRESHOLD="4096")
        try:
            self.assertEqual(sd.engine_config()["fusion_threshold_bytes"], 4096)
            shapes = [(10,), (5000,), (0,), (3, 7), (2048,), (1,), (1025,)]
            dtypes = [tf.float32, tf.float16, tf.float32, tf.int32, tf.float32, tf.float64, tf.float32]
            tensors = [tf.fill(s, tf.cast(RANK + 1, dt)) for s, dt in zip(shapes, dtypes)]
            outs = sd.grouped_allreduce(tensors, op=sd.Sum)
            total = SIZE * (SIZE + 1) / 2
            for out, s, dt in zip(outs, shapes, dtypes):
                self.assertEqual(out.dtype, dt)
                self.assertAllClose(tf.cast(out, tf.float64), np.full(s, total))
        finally:
            restart_engine(SMDIST_FUSION_THRESHOLD="")


    def test_scale_factors_that_differ_in_the_last_bit_never_fuse(self):
        # 2**23 * (1 + 2**-23) is 2**23 + 1 exactly in float32; fused under one prescale it would be 2**23.
        x = tf.fill([8], tf.constant(2.0 ** 23, tf.float32))

        @tf.function
        def step():
            plain = [sd.allreduce(x, op=sd.Sum, name=f"scale.plain.{i}") for i in range(16)]
            nudged = [sd.allreduce(x, op=sd.Sum, prescale_factor=1.0 + 2.0 ** -23, name=f"scale.nudged.{i}")
                      for i in range(16)]
            return plain, nudged

        for _ in range(10):
            plain, nudged = step()
            for p, q in zip(plain, nudged):
                self.assertAllEqual(p, np.full([8], SIZE * 2.0 ** 23, np.float32))
                self.assertAllEqual(q, np.full([8], SIZE * (2.0 ** 23 + 1), np.float32))

    def test_large_tensors_in_a_fused_group_skip_the_fusion_buffer(self):
        # MPI and shared-memory copy paths: tensors of 1 MiB or more are reduced where they lie,
        # the small ones of the same response are packed; results and order must not change.
        shapes = [(7,), (300000,), (0,), (3, 5), (262144,), (1,)]
        for env in [dict(SMDIST_CROSS_MEMORY_ATTACH="0"), dict(SMDIST_CROSS_MEMORY_ATTACH="0", SMDIST_SHM_SEGMENT_BYTES="0")]:
            restart_engine(**env)
            try:
                for op, pre, post in [(sd.Sum, 1.0, 1.0), (sd.Average, 2.0, 0.5)]:
                    with self.subTest(env=env, op=op):
                        values = [all_rank_values(s, tf.float32, op, seed=i) for i, s in enumerate(shapes)]
                        outs = sd.grouped_allreduce([tf.constant(v[RANK]) for v in values], op=op, prescale_factor=pre,
                                                    postscale_factor=post, name=f"unfused.{len(env)}.{op}")
                        for out, v in zip(outs, values):
                            self.assertEqual(out.shape, v[RANK].shape)
                            self.assertAllClose(out, expected_reduction(v, op, tf.float32, pre, post), rtol=1e-5, atol=1e-4)
            finally:
                restart_engine(**{k: "" for k in env})


class FusionPlanTest(tf.test.TestCase):
    """The fusion planner's plan for one allreduce, as the live engine would run it: each step
    goes to the first transport whose Enabled() takes it (cross-memory, shared memory, MPI)."""

    def plan(self, counts, dtype="float32", compression="none", prescale=1.0):
        from smdist_tf import _native

        lines = _native.load()[0]._allreduce_plan(counts, dtype, compression, prescale)
        # Every rank plans alike, or the ranks would call different transports.
        self.assertEqual(sd.allgather_object(lines), [lines] * SIZE)
        return lines

    def test_each_step_goes_to_the_first_transport_that_takes_it(self):
        restart_engine(SMDIST_SHM_MIN_BYTES="65536", SMDIST_CROSS_MEMORY_MIN_BYTES="1048576")
        try:
            cma = "cross_memory" if sd.engine_config()["intra_host_allreduce"] == "cross_memory_attach" else None
            self.assertEqual(self.plan([1000]), ["mpi in_place 0"])
            self.assertEqual(self.plan([1000, 2000, 3000]), ["mpi packed 0,1,2"])  # too small for shared memory
            self.assertEqual(self.plan([20000] * 4), ["shared_memory in_place 0,1,2,3"])
            self.assertEqual(self.plan([300000]), [f"{cma or 'shared_memory'} in_place 0"])
            # Read in place only when nothing is converted or prescaled; staging does both.
            self.assertEqual(self.plan([300000], prescale=2.0), ["shared_memory in_place 0"])
            self.assertEqual(self.plan([300000], compression="fp16"), ["shared_memory in_place 0"])
            self.assertEqual(self.plan([300000], dtype="int32", compression="fp16"), [f"{cma or 'shared_memory'} in_place 0"])
            with self.assertRaisesRegex(ValueError, "unknown dtype"):
                self.plan([1], dtype="complex64")
        finally:
            restart_engine(SMDIST_SHM_MIN_BYTES="", SMDIST_CROSS_MEMORY_MIN_BYTES="")

    def test_with_mpi_alone_large_tensors_travel_alone_and_the_rest_are_packed(self):
        restart_engine(SMDIST_CROSS_MEMORY_ATTACH="0", SMDIST_SHM_SEGMENT_BYTES="0")
        try:
            self.assertEqual(sd.engine_config()["intra_host_allreduce"], "mpi")
            self.assertEqual(self.plan([7, 300000, 0, 15, 262144, 1]),
                             ["mpi in_place 1", "mpi in_place 4", "mpi packed 0,2,3,5"])
            self.assertEqual(self.plan([300000], prescale=2.0), ["mpi in_place 0"])  # scaled into its output first
            self.assertEqual(self.plan([300000, 10], compression="fp16"), ["mpi packed 0,1"])  # the buffer holds fp16
        finally:
            restart_engine(SMDIST_CROSS_MEMORY_ATTACH="", SMDIST_SHM_SEGMENT_BYTES="")


class SharedMemoryPathTest(tf.test.TestCase):
    """Large allreduces take the shared-memory path; force it for every size and chunk boundary."""

    def _check_all(self, counts):
        from tests.mp.collective_expectations import all_rank_values, expected_reduction, tolerance

        for dtype in [tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int32, tf.int8, tf.uint8, tf.int64]:
            for op in [sd.Sum, sd.Average, sd.Min, sd.Max, sd.Product]:
                for count in counts:
                    with self.subTest(dtype=dtype.name, op=op, count=count):
                        values = all_rank_values((count,), dtype, op, seed=count)
                        out = sd.allreduce(tf.constant(values[RANK], dtype), op=op, name=f"shm.{dtype.name}.{op}.{count}")
                        self.assertAllClose(tf.cast(out, tf.float64), expected_reduction(values, op, dtype), **tolerance(dtype))

    def _check_nan_and_inf_propagate(self, name):
        big = np.full([50000], 2.0, np.float16)
        big[7] = np.inf
        big[40000] = np.nan
        out = sd.allreduce(tf.constant(big), op=sd.Sum, name=name).numpy()
        self.assertEqual(out[7], np.inf)
        self.assertTrue(np.isnan(out[40000]))
        self.assertEqual(out[0], 2.0 * SIZE)

    def _check_scaling_is_exact(self, prefix):
        # Sums of small integers are exact in any order, so the scaled result has one right
        # answer: the float sum times the factor in the tensor's type, rounded once. Holds
        # whether the scaling is folded into the reduction, into the copies, or separate.
        for dtype, np_dtype in [(tf.float32, np.float32), (tf.float64, np.float64)]:
            for op, post in [(sd.Average, 1.0), (sd.Sum, 1.0 / 3.0), (sd.Average, 0.7)]:
                with self.subTest(dtype=dtype.name, op=op, post=post):
                    ints = [np.arange(300001, dtype=np.int64) % (97 + 13 * r) for r in range(SIZE)]
                    out = sd.allreduce(tf.constant(ints[RANK].astype(np_dtype)), op=op, postscale_factor=post,
                                       name=f"{prefix}.exact.{dtype.name}.{op}.{post}")
                    post_attr = float(np.float32(post))  # the op's attribute is 32-bit, as in Horovod
                    factor = np_dtype(post_attr / SIZE if op == sd.Average else post_attr)
                    self.assertAllEqual(out.numpy(), sum(ints).astype(np_dtype) * factor)

    def _check_fused_spans(self, prefix):
        # One response of many tensors, empty ones included, reduced without a fusion buffer;
        # integer Average divides afterwards, float scaling is folded into the copies.
        from tests.mp.collective_expectations import all_rank_values, expected_reduction, tolerance

        shapes = [(0,), (5,), (1,), (70001,), (0, 3), (33, 2), (1,)]
        for dtype in [tf.float32, tf.float16, tf.bfloat16, tf.int32]:
            for op, pre, post in [(sd.Sum, 1.0, 1.0), (sd.Average, 1.0, 1.0), (sd.Sum, 1.0, 0.5), (sd.Average, 2.0, 3.0), (sd.Max, 1.0, 1.0)]:
                with self.subTest(dtype=dtype.name, op=op, pre=pre, post=post):
                    values = [all_rank_values(shape, dtype, op, seed=i) for i, shape in enumerate(shapes)]
                    outs = sd.grouped_allreduce([tf.constant(v[RANK], dtype) for v in values], op=op,
                                                prescale_factor=pre, postscale_factor=post,
                                                name=f"{prefix}.{dtype.name}.{op}.{pre}.{post}")
                    for out, v in zip(outs, values):
                        self.assertEqual(out.shape, v[RANK].shape)
                        self.assertAllClose(tf.cast(out, tf.float64), expected_reduction(v, op, dtype, pre, post), **tolerance(dtype))

    def test_default_segment_large_tensors(self):
        # Cross-memory attach off: with it, the measured threshold may send these sizes there.
        restart_engine(SMDIST_CROSS_MEMORY_ATTACH="0")
        try:
            self.assertGreater(sd.engine_config()["shm_segment_bytes"], 0)
            self.assertEqual(sd.engine_config()["intra_host_allreduce"], "shared_memory")
            self._check_all([70001, 300001])  # 300001 floats: two rounds of the default 1 MiB
        finally:
            restart_engine(SMDIST_CROSS_MEMORY_ATTACH="")

    def test_tiny_segments_many_chunks_and_shard_edges(self):
        restart_engine(SMDIST_SHM_SEGMENT_BYTES="4096", SMDIST_SHM_MIN_BYTES="0", SMDIST_CROSS_MEMORY_ATTACH="0")
        try:
            self.assertEqual(sd.engine_config()["intra_host_allreduce"], "shared_memory")
            self._check_all([1, 3, 17, 1000, 4099])
            self._check_nan_and_inf_propagate("shm.nan")
            # fp16 sums accumulate in float32: 2049 + 1 + ... does not stall at 2048.
            vals = np.full([8192], 2048.0 if RANK == 0 else 1.0, np.float16)
            out = sd.allreduce(tf.constant(vals), op=sd.Sum, name="shm.accumulate").numpy()
            self.assertAllEqual(out, np.full([8192], np.float16(2048.0 + (SIZE - 1))))
            # Fused tensors staged straight into the rounds: spans cross round and shard edges.
            self._check_fused_spans("shm.fused")
            self._check_scaling_is_exact("shm")
        finally:
            restart_engine(SMDIST_SHM_SEGMENT_BYTES="", SMDIST_SHM_MIN_BYTES="", SMDIST_CROSS_MEMORY_ATTACH="")


def _buffer_address(t: tf.Tensor) -> int:
    """Where a CPU tensor's data lives (DLPack exposes the buffer itself; .numpy() copies)."""
    import ctypes

    capsule = tf.experimental.dlpack.to_dlpack(t)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ctypes.c_void_p.from_address(get(capsule, b"dltensor")).value  # DLTensor.data comes first


def _mapping_of(address: int) -> dict:
    """The /proc/self/smaps entry of the mapping holding ``address``: {"VmFlags": [...], "path": str, key: kB}."""
    found, entry = None, {}
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                if found is not None:
                    break
                lo, hi = (int(v, 16) for v in head.split("-"))
                if lo <= address < hi:
                    found = entry
                    entry["path"] = " ".join(line.split()[5:])
            elif found is not None:
                key, _, value = line.partition(":")
                found[key] = value.split() if key == "VmFlags" else int(value.split()[0])
    return found or {}


def skip_without_cross_memory_attach(test: tf.test.TestCase) -> None:
    """Skips `test` unless the engine, as now configured, reads peers' memory directly."""
    if sd.engine_config()["intra_host_allreduce"] != "cross_memory_attach":
        test.skipTest("this OS does not let ranks read each other's memory (ptrace restrictions)")


class CrossMemoryPathTest(tf.test.TestCase):
    """Single-host allreduces that read peers' tensors in place (process_vm_readv), fused without a buffer."""

    def setUp(self):
        super().setUp()
        restart_engine(SMDIST_SHM_MIN_BYTES="0", SMDIST_CROSS_MEMORY_MIN_BYTES="0")
        skip_without_cross_memory_attach(self)

    def tearDown(self):
        restart_engine(SMDIST_SHM_MIN_BYTES="", SMDIST_CROSS_MEMORY_MIN_BYTES="")
        super().tearDown()

    def test_every_dtype_op_and_shard_edge(self):
        SharedMemoryPathTest._check_all(self, [1, 3, 17, 1000, 70001])

    def test_fused_spans_with_empty_tensors_and_scaling(self):
        SharedMemoryPathTest._check_fused_spans(self, "cma")

    def test_scaled_results_are_exact(self):
        SharedMemoryPathTest._check_scaling_is_exact(self, "cma")

    def test_results_bit_identical_on_all_ranks(self):
        x = tf.random.stateless_normal([300001], seed=[RANK, 1])
        for dtype in [tf.float32, tf.float16, tf.bfloat16]:
            out = sd.allreduce(tf.cast(x, dtype), op=sd.Average, name=f"cma.bits.{dtype.name}")
            bits = tf.bitcast(out, tf.int32) if dtype == tf.float32 else tf.cast(tf.bitcast(out, tf.uint16), tf.int32)
            gathered = sd.allgather(tf.expand_dims(bits, 0)).numpy()
            self.assertTrue((gathered == gathered[0]).all(), dtype.name)

    def test_in_place_inside_tf_function(self):
        # Inside a graph the input is forwarded to the output: peers then read a buffer
        # this rank is overwriting, which the shard order must keep safe.
        @tf.function
        def step(seed):
            grads = [tf.fill([n], tf.cast(seed, tf.float32)) * 1.0 for n in (100003, 7, 65536)]
            return sd.grouped_allreduce(grads, op=sd.Sum, name="cma.inplace")

        for _ in range(3):
            outs = step(tf.constant(RANK + 1))
            total = SIZE * (SIZE + 1) / 2
            for out in outs:
                self.assertAllEqual(out, np.full(out.shape, total, np.float32))

    def test_nan_and_inf_propagate(self):
        SharedMemoryPathTest._check_nan_and_inf_propagate(self, "cma.nan")

    def test_many_small_tensors_are_staged_and_large_ones_read_in_place(self):
        # Below a mean of 8 KiB per tensor a group goes through the shared segments: per-tensor
        # page walks would cost more than the copy. The timeline names the path each group took.
        import json

        template = os.path.join(tempfile.mkdtemp(), "timeline.{rank}.json")
        path = template.format(rank=RANK)
        groups = {"spans.small": [(256,)] * 64, "spans.large": [(16384,)] * 4, "spans.mixed": [(300000,)] + [(8,)] * 40}
        sd.start_timeline(template)
        for name, shapes in groups.items():
            values = [all_rank_values(shape, tf.float32, sd.Sum, seed=i) for i, shape in enumerate(shapes)]
            outs = sd.grouped_allreduce([tf.constant(v[RANK]) for v in values], op=sd.Sum, name=name)
            for out, v in zip(outs, values):
                self.assertAllClose(out, expected_reduction(v, sd.Sum, tf.float32), rtol=1e-5, atol=1e-5)
        sd.stop_timeline()
        with open(path) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        taken = {rows[e["tid"]]: e.get("args", {}).get("path") for e in events if e["ph"] == "X" and e["name"] == "ALLREDUCE"}
        self.assertEqual(taken["spans.small.0"], "shared_memory")
        self.assertEqual(taken["spans.small.63"], "shared_memory")
        self.assertEqual(taken["spans.large.0"], "cross_memory")
        self.assertEqual(taken["spans.mixed.40"], "cross_memory")  # 1.2 MB over 41 tensors

    def test_large_tensors_are_moved_to_huge_pages(self):
        # TensorFlow never asks for huge pages; the engine does for tensors of 4 MiB and
        # more, since peers pin them page by page. Only "madvise" mode can tell: "always"
        # gives huge pages anyway, "never" none. No output arena: the output is then
        # TensorFlow's memory, which peers write with process_vm_writev.
        restart_engine(SMDIST_SHM_MIN_BYTES="0", SMDIST_CROSS_MEMORY_MIN_BYTES="0", SMDIST_SHARED_OUTPUT_BYTES="0")
        try:
            with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
                mode = re.search(r"\[(\w+)\]", f.read()).group(1)
        except OSError:
            mode = "absent"
        if mode != "madvise":
            self.skipTest(f"transparent huge pages are '{mode}' here, not 'madvise'")
        x = tf.fill([5 << 20], float(RANK + 1))  # 20 MiB: not a whole number of huge pages
        out = sd.allreduce(x, op=sd.Sum, name="cma.hugepages")
        self.assertAllEqual(out, np.full([5 << 20], SIZE * (SIZE + 1) / 2, np.float32))
        for what, t in (("input", x), ("output", out)):
            mapping = _mapping_of(_buffer_address(t))
            self.assertIn("hg", mapping.get("VmFlags", []), what)  # MADV_HUGEPAGE
            if tuple(int(v) for v in re.findall(r"\d+", os.uname().release)[:2]) >= (6, 1):
                self.assertGreaterEqual(mapping.get("AnonHugePages", 0), 2048, what)  # MADV_COLLAPSE


def _arena_in_use() -> int:
    from smdist_tf import _native

    return _native.load()[0]._shared_output_bytes_in_use()


class SharedOutputArenaTest(tf.test.TestCase):
    """Allreduce outputs in memory every local rank maps: peers store reduced shards into them."""

    PAGE = 4096

    def setUp(self):
        super().setUp()
        restart_engine(SMDIST_SHM_MIN_BYTES="0", SMDIST_CROSS_MEMORY_MIN_BYTES="0")
        skip_without_cross_memory_attach(self)

    def tearDown(self):
        restart_engine(SMDIST_SHM_MIN_BYTES="", SMDIST_CROSS_MEMORY_MIN_BYTES="", SMDIST_SHARED_OUTPUT_BYTES="")
        super().tearDown()

    def _reduce(self, count: int, name: str, seed: int = 0) -> tf.Tensor:
        values = all_rank_values((count,), tf.float32, sd.Sum, seed=seed)
        out = sd.allreduce(tf.constant(values[RANK]), op=sd.Sum, name=name)
        self.assertAllClose(out, expected_reduction(values, sd.Sum, tf.float32), rtol=1e-5, atol=1e-5)
        return out

    def test_outputs_live_in_the_arena_until_freed(self):
        self.assertEqual(sd.engine_config()["shared_output_bytes"], 128 << 20)
        before = _arena_in_use()
        big = self._reduce(300001, "arena.big")
        self.assertIn("smdist-output-arena", _mapping_of(_buffer_address(big)).get("path", ""))
        self.assertEqual(_arena_in_use() - before, -(-300001 * 4 // self.PAGE) * self.PAGE)
        small = self._reduce(1000, "arena.small")  # below 64 KiB: TensorFlow's memory
        self.assertNotIn("smdist-output-arena", _mapping_of(_buffer_address(small)).get("path", ""))
        del big
        self.assertEqual(_arena_in_use(), before)

    def test_held_outputs_survive_later_collectives(self):
        values = all_rank_values((200003,), tf.float32, sd.Sum, seed=5)
        held = sd.allreduce(tf.constant(values[RANK]), op=sd.Sum, name="arena.held")
        expected = expected_reduction(values, sd.Sum, tf.float32)
        for i in range(5):
            self._reduce(200003 + i, f"arena.later.{i}", seed=i)
        self.assertAllClose(held, expected, rtol=1e-5, atol=1e-5)

    def test_outputs_feed_later_allreduces(self):
        # An input in a peer's arena is read straight from it, in place inside tf.function.
        values = all_rank_values((150001,), tf.float32, sd.Sum, seed=9)
        expected = expected_reduction(values, sd.Sum, tf.float32)
        once = sd.allreduce(tf.constant(values[RANK]), op=sd.Sum, name="arena.chain.0")
        self.assertIn("smdist-output-arena", _mapping_of(_buffer_address(once)).get("path", ""))
        twice = sd.allreduce(once, op=sd.Average, name="arena.chain.1")
        self.assertAllClose(twice, expected, rtol=1e-5, atol=1e-5)

        @tf.function(autograph=False)
        def chain(x):
            for i in range(4):
                x = sd.allreduce(x, op=sd.Average, name=f"arena.graph.{i}")
            return x

        self.assertAllClose(chain(once), expected, rtol=1e-5, atol=1e-5)
        mixed = sd.grouped_allreduce([once, tf.constant(values[RANK])], op=sd.Sum, name="arena.chain.mixed")
        self.assertAllClose(mixed[0], expected * SIZE, rtol=1e-5, atol=1e-5)
        self.assertAllClose(mixed[1], expected, rtol=1e-5, atol=1e-5)

    def test_a_full_arena_falls_back_and_freed_ranges_merge(self):
        # 1 MiB: four outputs of 256 KiB fill it; a fifth goes to TensorFlow's allocator.
        restart_engine(SMDIST_SHARED_OUTPUT_BYTES=str(1 << 20))
        self.assertEqual(sd.engine_config()["shared_output_bytes"], 1 << 20)
        outs = [self._reduce(65536, f"arena.fill.{i}", seed=i) for i in range(5)]
        self.assertEqual(_arena_in_use(), 1 << 20)
        in_arena = ["smdist-output-arena" in _mapping_of(_buffer_address(t)).get("path", "") for t in outs]
        self.assertEqual(in_arena, [True] * 4 + [False])
        # Freeing the two middle blocks leaves one 512 KiB range, which a 512 KiB output takes.
        del outs[1:3]
        merged = self._reduce(131072, "arena.merged")
        self.assertIn("smdist-output-arena", _mapping_of(_buffer_address(merged)).get("path", ""))
        self.assertEqual(_arena_in_use(), 1 << 20)
        del outs, merged, in_arena
        whole = self._reduce(262144, "arena.whole")  # everything merged back into one range
        self.assertEqual(_arena_in_use(), 1 << 20)
        del whole
        self.assertEqual(_arena_in_use(), 0)

    def test_outputs_in_and_out_of_the_arena_mix_across_ranks(self):
        # Rank 0's arena holds one output, the others' every one: each peer is written
        # through its own path in the same collective.
        restart_engine(SMDIST_SHARED_OUTPUT_BYTES=str(1 << 20) if RANK == 0 else "")
        values = [all_rank_values((150001,), tf.float32, sd.Sum, seed=i) for i in range(3)]
        outs = sd.grouped_allreduce([tf.constant(v[RANK]) for v in values], op=sd.Sum, name="arena.mixed")
        for out, v in zip(outs, values):
            self.assertAllClose(out, expected_reduction(v, sd.Sum, tf.float32), rtol=1e-5, atol=1e-5)

    def test_outputs_outlive_shutdown(self):
        held = self._reduce(100003, "arena.shutdown")
        expected = held.numpy()
        sd.shutdown()
        try:
            self.assertAllEqual(held, expected)
            del held  # frees its block after the engine let go of the arena
        finally:
            sd.init()

    def test_off_when_any_rank_cannot_map_one(self):
        # 1 EiB, beyond any address space: rank 0 cannot map it, so no rank uses an arena.
        restart_engine(SMDIST_SHARED_OUTPUT_BYTES=str(2**60) if RANK == 0 else "")
        self.assertEqual(sd.engine_config()["shared_output_bytes"], 0)
        self.assertEqual(sd.engine_config()["intra_host_allreduce"], "cross_memory_attach")
        out = self._reduce(300001, "arena.off")
        self.assertNotIn("smdist-output-arena", _mapping_of(_buffer_address(out)).get("path", ""))
        self.assertEqual(_arena_in_use(), 0)

    def test_zero_turns_it_off(self):
        restart_engine(SMDIST_SHARED_OUTPUT_BYTES="0")
        self.assertEqual(sd.engine_config()["shared_output_bytes"], 0)
        self._reduce(300001, "arena.zero")


class CrossMemoryThresholdTest(tf.test.TestCase):
    """Where single-host allreduces switch to cross-memory attach: measured at init unless set."""

    CANDIDATES = {256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20}

    def test_measured_threshold_is_the_same_on_every_rank_and_reduces_correctly(self):
        restart_engine(SMDIST_CROSS_MEMORY_MIN_BYTES="")
        skip_without_cross_memory_attach(self)
        config = sd.engine_config()
        self.assertTrue(config["cross_memory_min_measured"])
        threshold = config["cross_memory_min_bytes"]
        self.assertIn(threshold, self.CANDIDATES)
        # Ranks that chose different paths for one size would hang or garble the result.
        seen = sd.allgather(tf.constant([threshold], tf.int64)).numpy()
        self.assertAllEqual(seen, np.full([SIZE], threshold))
        for count in (threshold // 4 - 1, threshold // 4):  # either side of the switch
            values = all_rank_values((count,), tf.float32, sd.Sum, seed=count)
            out = sd.allreduce(tf.constant(values[RANK]), op=sd.Sum, name=f"cma.threshold.{count}")
            self.assertAllClose(out, expected_reduction(values, sd.Sum, tf.float32), rtol=1e-5, atol=1e-5)

    def test_nothing_is_measured_above_the_shared_memory_floor(self):
        # Below SMDIST_SHM_MIN_BYTES MPI reduces anyway: no size is left to time.
        restart_engine(SMDIST_CROSS_MEMORY_MIN_BYTES="", SMDIST_SHM_MIN_BYTES=str(3 << 20))
        try:
            skip_without_cross_memory_attach(self)
            config = sd.engine_config()
            self.assertFalse(config["cross_memory_min_measured"])
            self.assertEqual(config["cross_memory_min_bytes"], 4 << 20)
            values = all_rank_values(((3 << 20) // 4,), tf.float32, sd.Sum, seed=3)
            out = sd.allreduce(tf.constant(values[RANK]), op=sd.Sum, name="cma.floor")
            self.assertAllClose(out, expected_reduction(values, sd.Sum, tf.float32), rtol=1e-5, atol=1e-5)
        finally:
            restart_engine(SMDIST_SHM_MIN_BYTES="")

    def test_a_given_threshold_is_used_as_is(self):
        restart_engine(SMDIST_CROSS_MEMORY_MIN_BYTES="3000000")
        try:
            skip_without_cross_memory_attach(self)
            config = sd.engine_config()
            self.assertFalse(config["cross_memory_min_measured"])
            self.assertEqual(config["cross_memory_min_bytes"], 3000000)
        finally:
            restart_engine(SMDIST_CROSS_MEMORY_MIN_BYTES="")


class WireCompressionTest(tf.test.TestCase):
    """Compression.fp16/bf16 inside the engine: narrowed on the way in, reduced, widened back.

    Every path: MPI (small), cross-memory attach and the shared-memory copy path (large).
    """

    PATHS = [
        ("mpi", dict()),
        ("cross_memory_attach", dict(SMDIST_SHM_MIN_BYTES="0", SMDIST_CROSS_MEMORY_MIN_BYTES="0")),
        ("shared_memory", dict(SMDIST_SHM_MIN_BYTES="0", SMDIST_CROSS_MEMORY_ATTACH="0", SMDIST_SHM_SEGMENT_BYTES="4096")),
    ]
    WIRE = {"fp16": (sd.Compression.fp16, np.float16), "bf16": (sd.Compression.bf16, tf.bfloat16.as_numpy_dtype)}

    @staticmethod
    def _expected(values, op, wire_np, prescale=1.0, postscale=1.0):
        # Each rank narrows x*prescale to the wire type; the sum accumulates in float32 and
        # is rounded to the wire type once; Average and postscale apply while widening.
        wired = [(v.astype(np.float64) * prescale).astype(np.float32).astype(wire_np).astype(np.float32) for v in values]
        stack = np.stack(wired)
        reduced = {sd.Sum: stack.sum(0), sd.Average: stack.sum(0), sd.Min: stack.min(0), sd.Max: stack.max(0),
                   sd.Product: stack.prod(0)}[op].astype(wire_np).astype(np.float64)
        if op == sd.Average:
            reduced = reduced / SIZE
        return reduced * postscale

    def _run_paths(self, check):
        for path, env in self.PATHS:
            restart_engine(**env)
            try:
                if path != "mpi" and sd.engine_config()["intra_host_allreduce"] != path:
                    continue  # e.g. cross-memory attach refused by ptrace settings
                with self.subTest(path=path):
                    check(path)
            finally:
                restart_engine(**{k: "" for k in env})

    def test_every_op_dtype_and_scale_against_local_result(self):
        def check(path):
            counts = [1, 17] if path == "mpi" else [1, 17, 70001]
            for wire, (compression, wire_np) in self.WIRE.items():
                for dtype in [tf.float32, tf.float64] + ([tf.float16] if wire == "bf16" else []):
                    for op in [sd.Sum, sd.Average, sd.Min, sd.Max, sd.Product]:
                        for count in counts:
                            for pre, post in [(1.0, 1.0), (0.5, 3.0)]:
                                values = all_rank_values((count,), dtype, op, seed=count)
                                out = sd.allreduce(tf.constant(values[RANK], dtype), op=op, compression=compression,
                                                   prescale_factor=pre, postscale_factor=post,
                                                   name=f"wire.{path}.{wire}.{dtype.name}.{op}.{count}.{pre}")
                                self.assertEqual(out.dtype, dtype)
                                # MPI reduces pairwise, rounding to the wire type at each of the
                                # size-1 steps: allow that many half-ulps of the partial sums (|x| < 32).
                                tol = dict(rtol=2e-3, atol=0.03) if wire == "fp16" else dict(rtol=1e-2, atol=0.25)
                                self.assertAllClose(tf.cast(out, tf.float64), self._expected(values, op, wire_np, pre, post),
                                                    **tol)

        self._run_paths(check)

    def test_values_really_travel_as_16_bits_and_uncompressed_fuse_separately(self):
        # 1 + 2**-12 is exact in float32 and rounds to 1 in float16 and bfloat16: a compressed
        # result must lose it, an uncompressed one in the same cycle (same dtype) must keep it.
        def check(path):
            n = 70001 if path != "mpi" else 9

            @tf.function
            def step(x):
                plain = sd.allreduce(x, op=sd.Sum, name=f"wire.plain.{path}")
                half = sd.allreduce(x, op=sd.Sum, compression=sd.Compression.fp16, name=f"wire.half.{path}")
                brain = sd.allreduce(x, op=sd.Sum, compression=sd.Compression.bf16, name=f"wire.brain.{path}")
                return plain, half, brain

            plain, half, brain = step(tf.fill([n], tf.constant(1.0 + 2.0 ** -12, tf.float32)))
            self.assertAllEqual(plain, np.full([n], SIZE * (1.0 + 2.0 ** -12), np.float32))
            self.assertAllEqual(half, np.full([n], SIZE, np.float32))
            self.assertAllEqual(brain, np.full([n], SIZE, np.float32))

        self._run_paths(check)

    def test_grouped_fused_bit_identical_nan_inf_and_overflow(self):
        def check(path):
            big = 70001 if path != "mpi" else 5
            x = tf.random.stateless_normal([big], seed=[RANK, 3])
            special = np.ones([8], np.float32)
            if RANK == 0:
                special[:3] = [np.inf, np.nan, 70000.0]  # 70000 overflows float16 to inf, as a cast would
            outs = sd.grouped_allreduce([x, tf.zeros([0]), tf.constant(special), tf.cast(x[:3], tf.float64)],
                                        op=sd.Average, compression=sd.Compression.fp16, name=f"wire.group.{path}")
            self.assertEqual([o.dtype for o in outs], [tf.float32, tf.float32, tf.float32, tf.float64])
            self.assertEqual(outs[1].shape, (0,))
            s = outs[2].numpy()
            self.assertEqual(s[0], np.inf)
            self.assertTrue(np.isnan(s[1]))
            self.assertEqual(s[2], np.inf)
            self.assertEqual(s[3], 1.0)
            bits = sd.allgather(tf.expand_dims(tf.bitcast(outs[0], tf.int32), 0), name=f"wire.bits.{path}").numpy()
            self.assertTrue((bits == bits[0]).all())

        self._run_paths(check)

    def test_gradient_of_compressed_allreduce(self):
        x = tf.constant([1.0, 2.0, 3.0])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sd.allreduce(x * (RANK + 1), op=sd.Sum, compression=sd.Compression.fp16, name="wire.grad")
            loss = tf.reduce_sum(y * y)
        # d/dx_r sum_i (sum_s (s+1) x_s)^2 = (r+1) * sum over ranks of 2*y = (r+1) * 2 * SIZE * y.
        total = SIZE * (SIZE + 1) / 2
        expected = (RANK + 1) * 2 * SIZE * total * np.array([1.0, 2.0, 3.0])
        self.assertAllClose(tape.gradient(loss, x), expected, rtol=2e-3)


class GraphOrderTest(tf.test.TestCase):
    def test_collectives_in_a_function_do_not_wait_for_each_other(self):
        # Ranks issue the same collectives in opposite program orders, two of each kind. Chained in
        # program order (tf.function's default for stateful ops) every rank would wait on its first
        # while its peers wait on another: a stall, turned into an error on every rank here.
        restart_engine(SMDIST_STALL_SHUTDOWN_TIME="20")
        try:
            value = tf.fill([SIZE], float(RANK + 1))
            kinds = {
                "allreduce": lambda n: sd.allreduce(value, op=sd.Sum, name=n),
                "allgather": lambda n: sd.allgather(value[:1], name=n),
                "broadcast": lambda n: sd.broadcast(value, root_rank=0, name=n),
                "alltoall": lambda n: sd.alltoall(value, name=n),
                "reducescatter": lambda n: sd.reducescatter(value, op=sd.Sum, name=n),
            }
            names = [f"order.{kind}.{i}" for kind in kinds for i in range(2)]
            if RANK > 0:
                names.reverse()

            @tf.function
            def step():
                return {n: kinds[n.split(".")[1]](n) for n in names}

            for _ in range(2):
                outs = step()
                for i in range(2):
                    self.assertAllEqual(outs[f"order.allreduce.{i}"], np.full([SIZE], SIZE * (SIZE + 1) / 2))
                    self.assertAllEqual(outs[f"order.allgather.{i}"], np.arange(1, SIZE + 1))
                    self.assertAllEqual(outs[f"order.broadcast.{i}"], np.ones([SIZE]))
                    self.assertAllEqual(outs[f"order.alltoall.{i}"], np.arange(1, SIZE + 1))
                    self.assertAllEqual(outs[f"order.reducescatter.{i}"], [SIZE * (SIZE + 1) / 2])
        finally:
            restart_engine(SMDIST_STALL_SHUTDOWN_TIME="")


class InlineCycleTest(tf.test.TestCase):
    """Allreduce callers run the engine cycle themselves when it is idle; peers may arrive late."""

    def test_graph_chains_run_on_parallel_threads_with_a_late_peer(self):
        # Three independent chains of dependent allreduces in one tf.function: TensorFlow
        # dispatches them on different inter-op threads, each of which may run a cycle, and a
        # `done` callback sets off the next allreduce of its chain from inside a cycle.
        @tf.function(autograph=False)
        def chains(x):
            outs = []
            for c in range(3):
                t = x + float(c)
                for k in range(6):
                    t = sd.allreduce(t, op=sd.Sum, name=f"inline.graph.{c}.{k}")
                outs.append(t)
            return outs

        for attempt in range(2):
            if RANK == SIZE - 1:
                time.sleep(0.2 * (attempt + 1))  # the others' inline cycles find this rank missing
            outs = chains(tf.fill([7], float(RANK)))
            for c, out in enumerate(outs):
                first = SIZE * (SIZE - 1) / 2 + SIZE * c
                self.assertAllEqual(out, np.full([7], first * SIZE ** 5, np.float32))

    def test_late_peer_and_concurrent_threads(self):
        if RANK == SIZE - 1:
            time.sleep(0.3)  # the others' inline cycles find this rank missing; the engine thread finishes
        out = sd.allreduce(tf.fill([5], float(RANK)), op=sd.Sum, name="inline.late")
        self.assertAllEqual(out, np.full([5], SIZE * (SIZE - 1) / 2, np.float32))
        results, errors = {}, []

        def submit(i):
            try:
                results[i] = sd.allreduce(tf.fill([3 + i], float(i + RANK)), op=sd.Sum, name=f"inline.thread{i}").numpy()
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        for i in range(6):
            self.assertAllEqual(results[i], np.full([3 + i], SIZE * i + SIZE * (SIZE - 1) / 2, np.float32))


def _voluntary_switches() -> int:
    """Voluntary context switches of every thread of this process so far."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                total += int(f.read().split("voluntary_ctxt_switches:")[1].split()[0])
        except (OSError, IndexError):
            pass  # a thread that ended meanwhile
    return total


class IdleEngineTest(tf.test.TestCase):
    """An idle engine negotiates ever less often, yet wakes at once for new work."""

    def test_idle_engine_backs_off_and_wakes_for_late_work(self):
        sd.allreduce(tf.ones([4]), name="idle.warmup")
        time.sleep(0.3)  # the backoff reaches its cap
        before = _voluntary_switches()
        time.sleep(1.0)
        woke = _voluntary_switches() - before
        # At the 1 ms cycle time every idle round woke the engine thread (~900 a second).
        self.assertLess(woke, 300, "the idle engine kept waking up")

        if RANK == LAST:
            time.sleep(0.5)  # the others' engines wait on an idle peer with a long backoff
        out = sd.allreduce(tf.fill([3], float(RANK)), op=sd.Sum, name="idle.late")
        self.assertAllEqual(out, np.full([3], SIZE * (SIZE - 1) / 2, np.float32))

        @tf.function
        def graph_allreduce(x):
            return sd.allreduce(x, op=sd.Sum, name="idle.graph")

        time.sleep(0.3)  # idle again: graph ops wake the engine thread, which must not sleep out its backoff
        start = time.time()
        for _ in range(20):
            out = graph_allreduce(tf.ones([2]))
        self.assertAllEqual(out, [SIZE, SIZE])
        # 20 wake-ups that waited out a 20 ms backoff would take 0.4 s; a generous bound.
        self.assertLess(time.time() - start, 5.0)


class UnpicklableObjectTest(tf.test.TestCase):
    """An object that cannot be pickled fails broadcast_object/allgather_object on every rank, never a hang."""

    def setUp(self):
        # A regression would leave some ranks waiting: make that a prompt AbortedError, not a hung suite.
        restart_engine(SMDIST_STALL_SHUTDOWN_TIME="30")

    def tearDown(self):
        restart_engine(SMDIST_STALL_SHUTDOWN_TIME="")

    def assert_pickling_fails_everywhere(self, call, *patterns):
        import pickle

        with self.assertRaises(pickle.PicklingError) as ctx:
            call()
        for pattern in patterns:
            self.assertRegex(str(ctx.exception), pattern)
        return ctx.exception

    def test_broadcast_object_fails_on_every_rank_when_the_root_cannot_pickle(self):
        self.assert_pickling_fails_everywhere(
            lambda: sd.broadcast_object((lambda: 0) if RANK == 0 else None, root_rank=0),
            r"^broadcast_object: root rank 0 could not pickle its function: \w+: .*<lambda>",
        )
        error = self.assert_pickling_fails_everywhere(
            lambda: sd.broadcast_object({"lock": threading.Lock()} if RANK == LAST else "unused", root_rank=LAST, name="objects.lock"),
            rf"^broadcast_object: root rank {LAST} could not pickle its dict: TypeError: .*'_thread\.lock'",
        )
        # The root keeps pickle's own error as the cause.
        self.assertIsInstance(error.__cause__, TypeError if RANK == LAST else type(None))
        # Only the root pickles: other ranks may hold anything.
        self.assertEqual(sd.broadcast_object([RANK] if RANK == LAST else threading.Lock(), root_rank=LAST), [LAST])
        self.assertEqual(sd.broadcast_object(("named", RANK), name="objects.after"), ("named", 0))
        self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name="objects.broadcast.healthy"), [SIZE, SIZE])

    def test_allgather_object_fails_on_every_rank_when_any_rank_cannot_pickle(self):
        self.assert_pickling_fails_everywhere(
            lambda: sd.allgather_object(threading.Lock() if RANK == LAST else RANK),
            rf"^allgather_object: could not pickle the object of rank {LAST}: _thread\.lock: TypeError: ",
        )
        if SIZE > 2:  # several ranks fail: each is named
            self.assert_pickling_fails_everywhere(
                lambda: sd.allgather_object(threading.Lock() if RANK % 2 else RANK, name="objects.odd"),
                r"rank 1: _thread\.lock: TypeError: .*; rank 3: _thread\.lock: TypeError: ",
            )
        self.assertEqual(sd.allgather_object({"rank": RANK}), [{"rank": r} for r in range(SIZE)])
        self.assertAllClose(sd.allreduce(tf.ones([2]), op=sd.Sum, name="objects.allgather.healthy"), [SIZE, SIZE])


if __name__ == "__main__":
    tf.test.main()
