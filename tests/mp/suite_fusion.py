"""Fusion and ordering in the engine: what one cycle fuses, the fusion plan, graph order, inline cycles, idling.

Run on every rank by tests/test_collectives_multiprocess.py, in one job with suite_errors.py and
suite_intra_host.py. Tests that change the engine's settings restart it and restore them.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf._native import runtime as _rt
from tests.mp.engine_restart import restart_engine
from tests.mp.collective_expectations import all_rank_values, expected_reduction

RANK, SIZE = sd.rank(), sd.size()
LAST = SIZE - 1


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


class IdleEngineTest(tf.test.TestCase):
    """An idle engine negotiates ever less often, yet wakes at once for new work."""

    def test_idle_engine_backs_off_and_wakes_for_late_work(self):
        sd.allreduce(tf.ones([4]), name="idle.warmup")
        time.sleep(0.3)  # the backoff reaches its cap
        before = _rt._cycles_run()
        time.sleep(1.0)
        cycles = _rt._cycles_run() - before
        # At the 1 ms cycle time an engine without backoff runs ~800 idle cycles a
        # second; capped at 20 ms, ~50.
        self.assertLess(cycles, 150, "the idle engine kept negotiating")

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


if __name__ == "__main__":
    tf.test.main()
