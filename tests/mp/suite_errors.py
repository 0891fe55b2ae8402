"""Every error path fails on every rank (never a hang), and the engine keeps working afterwards.

Run on every rank by tests/test_collectives_multiprocess.py, in one job with suite_fusion.py and
suite_intra_host.py. The tests that stop the engine restart it (shutdown() then init() reads the
environment again).
"""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.captured_stderr import CapturedStderr
from tests.mp.engine_restart import restart_engine

RANK, SIZE = sd.rank(), sd.size()
LAST = SIZE - 1


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
            ones, submitting = tf.ones([1]), threading.Event()

            def first_dup():
                submitting.set()
                result["v"] = sd.allreduce(ones, op=sd.Sum, name="dup")

            t = threading.Thread(target=first_dup)
            t.start()
            # The op is queued within microseconds of the call: waiting for the call, not for the thread to start,
            # keeps a loaded machine from sending this thread's 'dup' first (it would then wait for the others).
            submitting.wait(timeout=60)
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
