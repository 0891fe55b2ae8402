"""join(): ranks that have joined sit out the collectives the others submit meanwhile.

Run on every rank by tests/test_join_multiprocess.py. In most tests the ranks of a
``joined`` set call ``join()`` at once, and the other ranks (the contributors) run
collectives and then join. Results are checked against NumPy over the contributors'
inputs only. Every scenario runs for several joined sets (rank 0, the coordinator;
the last rank; at 4 ranks also two ranks, and every rank but 0).

Every collective a rank may submit while another rank is joined has a name: unnamed
eager calls are numbered per rank, and a joined rank's count does not advance.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.collective_expectations import (
    MOVABLE,
    REDUCE_OPS,
    REDUCIBLE,
    contributors,
    expected_reduction,
    tolerance,
)
from tests.mp.collective_expectations import rank_values as _rank_values

# Every rank builds every contributor's inputs for its expectations, for each joined set: memoized.
# The arrays are shared, never modified.
rank_values = functools.lru_cache(maxsize=None)(_rank_values)

RANK, SIZE = sd.rank(), sd.size()
LAST = SIZE - 1
# Which ranks join while the others work: the coordinator, the last rank, and at 4 ranks
# two ranks at once, and all ranks but one.
JOIN_SETS = [(0,), (LAST,)] + ([(0, 2), tuple(range(1, SIZE))] if SIZE >= 4 else [])
SHAPES = [(), (5,), (2, 3)]
HANG_S = 150  # a test still running after this is hung (each takes seconds): end the job with the stack instead
ERROR_S = 20  # an error caused by a joined rank must reach every rank within this
DELAY_S = 0.3  # long enough for the other ranks to be waiting


def tag(joined) -> str:
    return "j" + "".join(map(str, joined))


def join_in_graph():
    return sd.join()


JOIN_GRAPH = tf.function(join_in_graph)




@contextlib.contextmanager
def engine_with(**env: str):
    """Restarts the engine on every rank with extra settings, and back without them afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    sd.shutdown()
    os.environ.update(env)
    sd.init()
    try:
        yield
    finally:
        sd.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sd.init()


PERIOD = 1021


def large_count(dtype: tf.DType) -> int:
    """Elements of a tensor of a little more than 4 MiB: large enough for the intra-host paths."""
    return (4 << 20) // dtype.size + 3


def large_values(rank: int, dtype: tf.DType, op: int, seed: int) -> np.ndarray:
    """rank_values of PERIOD elements repeated to large_count: cheap to build, and to check with
    np.resize(expected_reduction(<the PERIOD-element values>), large_count)."""
    return np.resize(rank_values(rank, (PERIOD,), dtype, op, seed), large_count(dtype))


class JoinTestCase(tf.test.TestCase):
    def run_joined(self, joined, work, *, join=None, delay_join=False, delay_work=False):
        """Ranks in `joined` call join(); the others run work(), then join().

        Returns work()'s result (None on joined ranks), after checking what join() returned.
        delay_join: the joined ranks join only once the others' collectives wait for them;
        delay_work: the others submit only once the joined ranks wait in join().
        """
        graph = join is not None
        join = join or sd.join
        if RANK in joined:
            if delay_join:
                time.sleep(DELAY_S)
            out, last = None, join()
        else:
            if delay_work:
                time.sleep(DELAY_S)
            out = work()
            last = join()
        self.check_last_joiner(last, contributors(joined), graph=graph)
        return out

    def check_last_joiner(self, last, allowed, graph=False) -> int:
        """join()'s result: a Python int eagerly, an int32 scalar in a graph; one of `allowed`; equal on every rank.

        The ranks compare results first and check them afterwards, so that one rank's failure
        does not leave the others waiting in the comparison.
        """
        value = int(last.numpy()) if isinstance(last, tf.Tensor) else int(last)
        seen = sd.allgather(tf.constant([value], tf.int32), name="join.agree").numpy()
        if graph:
            self.assertIsInstance(last, tf.Tensor)
            self.assertEqual(last.dtype, tf.int32)
            self.assertEqual(tuple(last.shape), ())
        else:
            self.assertIsInstance(last, int)
            self.assertNotIsInstance(last, bool)
        self.assertIn(value, list(allowed))
        self.assertAllEqual(seen, [value] * SIZE, "ranks disagree on the last rank to join")
        return value

    def assert_matches(self, out, expected, dtype, what, **tol):
        got = tf.cast(out, tf.float64).numpy() if out.dtype != tf.bool else out.numpy()
        self.assertEqual(out.dtype, dtype, what)
        self.assertEqual(got.shape, np.shape(expected), what)
        if dtype == tf.bool:
            bad = got != expected
        else:
            tol = tol or tolerance(dtype)
            bad = ~np.isclose(got, expected, rtol=tol["rtol"], atol=tol["atol"])
        if np.any(bad):
            idx = np.flatnonzero(bad)[:5]
            self.fail(f"{what}: {int(np.sum(bad))} of {np.size(bad)} elements wrong, e.g. at {idx.tolist()}: "
                      f"got {np.ravel(got)[idx].tolist()}, expected {np.ravel(expected)[idx].tolist()}")

    def assert_repeats(self, out, block, dtype, count, what, **tol):
        """`out` is a vector of `count` elements: `block` (the expected result) repeated, the last copy cut short.

        Large results are compared in their own dtype (float32 for 16-bit floats), period by period.
        """
        self.assertEqual(out.dtype, dtype, what)
        got = out.numpy()
        self.assertEqual(got.shape, (count,), what)
        period = block.size
        full = count // period * period
        parts = [(got[:full].reshape(-1, period), block[None, :]), (got[full:], block[: count - full])]
        if dtype.is_floating:
            cmp = np.float64 if dtype == tf.float64 else np.float32
            tol = tol or tolerance(dtype)
            bad = [~np.isclose(g.astype(cmp), e.astype(cmp), rtol=tol["rtol"], atol=tol["atol"]) for g, e in parts]
        else:
            bad = [g != e.astype(got.dtype) for g, e in parts]  # exact integers
        bad = np.concatenate([b.ravel() for b in bad])
        if bad.any():
            idx = np.flatnonzero(bad)[:5]
            self.fail(f"{what}: {int(bad.sum())} of {count} elements wrong, e.g. at {idx.tolist()}: got "
                      f"{got[idx].astype(np.float64).tolist()}, expected {block[idx % period].astype(np.float64).tolist()}")


class AllreduceTest(JoinTestCase):
    """Joined ranks contribute zeros to Sum/Average (which divides by the contributors) and the identity to Min/Max/Product."""

    CASES = [(dt, op, SHAPES[i % 3]) for i, (dt, op) in enumerate((dt, op) for dt in REDUCIBLE for op in REDUCE_OPS)]

    def _check_cases(self, joined, outs, cases, pre=1.0, post=1.0):
        for i, ((dt, op, shape), out) in enumerate(zip(cases, outs)):
            values = [rank_values(r, shape, dt, op, seed=i) for r in contributors(joined)]
            self.assert_matches(out, expected_reduction(values, op, dt, pre, post), dt,
                                f"{tag(joined)} {dt.name} op {op} shape {shape}")

    def test_every_dtype_and_op_eager(self):
        for joined in JOIN_SETS:
            t = tag(joined)

            def work():
                return [sd.allreduce(tf.constant(rank_values(RANK, shape, dt, op, seed=i), dt), op=op, name=f"{t}.ar.{i}")
                        for i, (dt, op, shape) in enumerate(self.CASES)]

            outs = self.run_joined(joined, work)
            if outs is not None:
                self._check_cases(joined, outs, self.CASES)

    def test_every_dtype_and_op_in_tf_function(self):
        # One step submits every (dtype, op) at once; each pair is fused. The joined ranks join in a graph too.
        @tf.function
        def step(xs):
            return [sd.allreduce(x, op=op, name=f"fn.ar.{i}") for i, (x, (_, op, _)) in enumerate(zip(xs, self.CASES))]

        for joined in JOIN_SETS:
            inputs = [tf.constant(rank_values(RANK, shape, dt, op, seed=i), dt) for i, (dt, op, shape) in enumerate(self.CASES)]
            outs = self.run_joined(joined, lambda: step(inputs), join=JOIN_GRAPH)
            if outs is not None:
                self._check_cases(joined, outs, self.CASES)

    def test_prescale_and_postscale(self):
        cases = [(dt, op, (7,)) for dt in REDUCIBLE for op in (sd.Sum, sd.Average)]
        for joined in JOIN_SETS:
            t = tag(joined)

            def work():
                return [sd.allreduce(tf.constant(rank_values(RANK, shape, dt, op, seed=i), dt), op=op, prescale_factor=0.5,
                                     postscale_factor=1.5, name=f"{t}.scaled.{i}")
                        for i, (dt, op, shape) in enumerate(cases)]

            outs = self.run_joined(joined, work)
            if outs is not None:
                self._check_cases(joined, outs, cases, pre=0.5, post=1.5)

    def test_grouped_allreduce_fuses_several_tensors(self):
        dtypes = [tf.float32, tf.int32, tf.float16, tf.float32, tf.bfloat16, tf.int64, tf.float64, tf.uint8, tf.float32]
        shapes = [(i % 4 + 1, 3) if i % 3 else (0,) if i == 3 else () for i in range(len(dtypes))]
        many = 60  # many small float32 tensors: one fused transfer

        def inputs(op, seed):
            return ([tf.constant(rank_values(RANK, s, dt, op, seed=seed + i), dt) for i, (s, dt) in enumerate(zip(shapes, dtypes))],
                    [tf.constant(rank_values(RANK, (i % 5 + 1,), tf.float32, op, seed=seed + 100 + i)) for i in range(many)])

        def expect(joined, op, seed, outs, pre=1.0, post=1.0, what=""):
            mixed, small = outs
            for i, (out, s, dt) in enumerate(zip(mixed, shapes, dtypes)):
                values = [rank_values(r, s, dt, op, seed=seed + i) for r in contributors(joined)]
                self.assert_matches(out, expected_reduction(values, op, dt, pre, post), dt, f"{what} mixed {i} {dt.name}")
            for i, out in enumerate(small):
                values = [rank_values(r, (i % 5 + 1,), tf.float32, op, seed=seed + 100 + i) for r in contributors(joined)]
                self.assert_matches(out, expected_reduction(values, op, tf.float32, pre, post), tf.float32, f"{what} small {i}")

        @tf.function
        def graph_step(mixed, small):
            return (sd.grouped_allreduce(mixed, op=sd.Sum, name="fn.group.mixed"),
                    sd.grouped_allreduce(small, op=sd.Average, name="fn.group.small"))

        for joined in JOIN_SETS:
            t = tag(joined)
            for k, (op, pre, post) in enumerate([(sd.Sum, 1.0, 1.0), (sd.Average, 1.0, 1.0), (sd.Average, 0.5, 1.5),
                                                 (sd.Max, 1.0, 1.0), (sd.Product, 1.0, 1.0)]):
                mixed, small = inputs(op, 10 * k)
                outs = self.run_joined(joined, lambda: (
                    sd.grouped_allreduce(mixed, op=op, prescale_factor=pre, postscale_factor=post, name=f"{t}.group.mixed.{k}"),
                    sd.grouped_allreduce(small, op=op, prescale_factor=pre, postscale_factor=post, name=f"{t}.group.small.{k}")))
                if outs is not None:
                    expect(joined, op, 10 * k, outs, pre, post, f"{t} eager op {op} pre {pre}")
            mixed_sum, _ = inputs(sd.Sum, 500)
            _, small_avg = inputs(sd.Average, 500)
            outs = self.run_joined(joined, lambda: graph_step(mixed_sum, small_avg), join=JOIN_GRAPH)
            if outs is not None:
                for i, (out, s, dt) in enumerate(zip(outs[0], shapes, dtypes)):
                    values = [rank_values(r, s, dt, sd.Sum, seed=500 + i) for r in contributors(joined)]
                    self.assert_matches(out, expected_reduction(values, sd.Sum, dt), dt, f"{t} graph mixed {i}")
                for i, out in enumerate(outs[1]):
                    values = [rank_values(r, (i % 5 + 1,), tf.float32, sd.Average, seed=600 + i) for r in contributors(joined)]
                    self.assert_matches(out, expected_reduction(values, sd.Average, tf.float32), tf.float32, f"{t} graph small {i}")

    def test_compression(self):
        wires = {"fp16": (sd.Compression.fp16, tf.float16), "bf16": (sd.Compression.bf16, tf.bfloat16)}
        for joined in JOIN_SETS:
            t = tag(joined)
            cases = [(name, dt, op, large) for name in wires for dt in (tf.float32, tf.float64) for op in REDUCE_OPS
                     for large in (False, True) if not large or op in (sd.Sum, sd.Average, sd.Min)]

            def work():
                return [sd.allreduce(tf.constant(large_values(RANK, dt, op, i) if large else rank_values(RANK, (64,), dt, op, i), dt),
                                     op=op, compression=wires[name][0], name=f"{t}.wire.{i}")
                        for i, (name, dt, op, large) in enumerate(cases)]

            outs = self.run_joined(joined, work)
            if outs is None:
                continue
            for i, ((name, dt, op, large), out) in enumerate(zip(cases, outs)):
                wire = wires[name][1]
                # What travels: each contributor's input rounded to the wire type.
                sent = [tf.cast(tf.cast(rank_values(r, (PERIOD,) if large else (64,), dt, op, i), wire), tf.float64).numpy()
                        for r in contributors(joined)]
                expected = expected_reduction(sent, op, tf.float64)
                what = f"{t} {name} {dt.name} op {op} large {large}"
                if large:
                    self.assert_repeats(out, expected, dt, large_count(dt), what, **tolerance(wire))
                else:
                    self.assert_matches(out, expected, dt, what, **tolerance(wire))

    def test_submitted_before_and_after_the_others_join(self):
        # Collectives already waiting when a rank joins, and collectives submitted to ranks already joined.
        for joined in [JOIN_SETS[0], JOIN_SETS[-1]]:
            for order in ("delay_join", "delay_work"):
                t = f"{tag(joined)}.{order}"
                values = [rank_values(r, (6,), tf.float32, seed=3) for r in range(SIZE)]

                def work():
                    return (sd.allreduce(tf.constant(values[RANK]), op=sd.Average, name=f"{t}.avg"),
                            sd.allgather(tf.fill([RANK + 1], RANK), name=f"{t}.gather"))

                outs = self.run_joined(joined, work, **{order: True})
                if outs is not None:
                    mine = [values[r] for r in contributors(joined)]
                    self.assertAllClose(outs[0], expected_reduction(mine, sd.Average, tf.float32), rtol=1e-5, atol=1e-5)
                    self.assertAllEqual(outs[1], np.concatenate([np.full([r + 1], r) for r in contributors(joined)]))

    # 4 MiB and more per tensor: cross-memory attach (the default where the OS allows it), the
    # shared-memory copy path, and MPI. Each (dtype, op) runs with one joined set (they rotate);
    # float32 Sum with every set.
    LARGE_CASES = [(dt, op, 1.0, 1.0) for dt in REDUCIBLE for op in REDUCE_OPS] + [
        (tf.float32, sd.Sum, 0.5, 1.5), (tf.float32, sd.Average, 0.5, 1.5), (tf.int32, sd.Average, 0.5, 1.5),
        (tf.bfloat16, sd.Sum, 0.5, 1.5)]

    def test_large_tensors_default_path(self):
        self._check_large_path("default", {})

    def test_large_tensors_shared_memory_path(self):
        self._check_large_path("shared_memory", dict(SMDIST_CROSS_MEMORY_ATTACH="0"))

    def test_large_tensors_mpi_path(self):
        self._check_large_path("mpi", dict(SMDIST_CROSS_MEMORY_ATTACH="0", SMDIST_SHM_SEGMENT_BYTES="0"))

    def _check_large_path(self, path, env):
        with engine_with(**env):
            expected_path = sd.engine_config()["intra_host_allreduce"] if path == "default" else path
            expected_path = {"cross_memory_attach": "cross_memory"}.get(expected_path, expected_path)
            for k, joined in enumerate(JOIN_SETS):
                t = f"{tag(joined)}.{path}"
                mine = [(i, c) for i, c in enumerate(self.LARGE_CASES) if i % len(JOIN_SETS) == k or i == 0]
                timeline = os.path.join(tempfile.mkdtemp(), "timeline.{rank}.json") if k == 0 else None

                def work():
                    if timeline:
                        sd.start_timeline(timeline)
                    outs = [sd.allreduce(tf.constant(large_values(RANK, dt, op, i), dt), op=op, prescale_factor=pre,
                                         postscale_factor=post, name=f"{t}.large.{i}") for i, (dt, op, pre, post) in mine]
                    if timeline:
                        sd.stop_timeline()
                    return outs

                outs = self.run_joined(joined, work)
                if outs is None:
                    continue
                for (i, (dt, op, pre, post)), out in zip(mine, outs):
                    values = [rank_values(r, (PERIOD,), dt, op, seed=i) for r in contributors(joined)]
                    self.assert_repeats(out, expected_reduction(values, op, dt, pre, post), dt, large_count(dt),
                                        f"{t} {dt.name} op {op} pre {pre} post {post}")
                if timeline:
                    self._check_path(timeline.format(rank=RANK), f"{t}.large.0", expected_path)
            self._check_large_fused_in_graph(path)

    def _check_path(self, timeline, name, expected_path):
        """The timeline shows which path moved `name` (no path given: MPI)."""
        with open(timeline) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        paths = [e.get("args", {}).get("path", "mpi") for e in events
                 if e["ph"] == "X" and e["name"] == "ALLREDUCE" and rows.get(e["tid"]) == name]
        self.assertEqual(paths, [expected_path], f"path of {name}")

    def _check_large_fused_in_graph(self, path):
        # Small and large tensors of one step in one response, reduced in place inside a graph.
        counts = [3, (4 << 20) // 4 + 1, 0, (1 << 20) + 5, 4]

        @tf.function
        def step(xs):
            return sd.grouped_allreduce(xs, op=sd.Sum, name=f"fn.large.{path}")

        for joined in [JOIN_SETS[0], JOIN_SETS[-1]]:
            def inputs():
                return [tf.constant(np.resize(rank_values(RANK, (97,), tf.float32, seed=i), n)) for i, n in enumerate(counts)]

            outs = self.run_joined(joined, lambda: step(inputs()), join=JOIN_GRAPH)
            if outs is None:
                continue
            for i, (out, n) in enumerate(zip(outs, counts)):
                values = [rank_values(r, (97,), tf.float32, seed=i) for r in contributors(joined)]
                self.assert_repeats(out, expected_reduction(values, sd.Sum, tf.float32), tf.float32, n,
                                    f"{tag(joined)} {path} fused graph tensor {i}")


class AllgatherTest(JoinTestCase):
    """Joined ranks contribute no rows."""

    def test_every_dtype_eager_and_in_tf_function(self):
        def rows(r):
            return (r + 1) % 3  # some contributors send none

        @tf.function
        def step(xs):
            return [sd.allgather(x, name=f"fn.gather.{dt.name}") for x, dt in zip(xs, MOVABLE)]

        for joined in JOIN_SETS:
            t = tag(joined)
            values = {dt: [rank_values(r, (rows(r), 2, 3), dt) for r in range(SIZE)] for dt in MOVABLE}
            inputs = [tf.constant(values[dt][RANK], dt) for dt in MOVABLE]

            def work():
                eager = [sd.allgather(x, name=f"{t}.gather.{dt.name}") for x, dt in zip(inputs, MOVABLE)]
                scalar = sd.allgather(tf.constant(RANK * 10), name=f"{t}.gather.scalar")
                return eager, scalar

            outs = self.run_joined(joined, work)
            graph_outs = self.run_joined(joined, lambda: step(inputs), join=JOIN_GRAPH)
            if outs is None:
                continue
            for dt, out, graph_out in zip(MOVABLE, outs[0], graph_outs):
                expected = np.concatenate([values[dt][r] for r in contributors(joined)])
                self.assert_matches(out, expected, dt, f"{t} eager {dt.name}")
                self.assert_matches(graph_out, expected, dt, f"{t} graph {dt.name}")
            self.assertAllEqual(outs[1], [r * 10 for r in contributors(joined)])


class BroadcastAndBarrierTest(JoinTestCase):
    def test_broadcast_from_a_root_that_has_not_joined(self):
        @tf.function
        def step(xs, root):
            return [sd.broadcast(x, root, name=f"fn.bcast.{root}.{dt.name}") for x, dt in zip(xs, MOVABLE)]

        for joined in JOIN_SETS:
            t = tag(joined)
            values = {dt: [rank_values(r, (3, 2), dt) for r in range(SIZE)] for dt in MOVABLE}
            inputs = [tf.constant(values[dt][RANK], dt) for dt in MOVABLE]
            for root in sorted({contributors(joined)[0], contributors(joined)[-1]}):
                outs = self.run_joined(joined, lambda: [sd.broadcast(x, root, name=f"{t}.bcast.{root}.{dt.name}")
                                                        for x, dt in zip(inputs, MOVABLE)])
                graph_outs = self.run_joined(joined, lambda: step(inputs, root), join=JOIN_GRAPH)
                if outs is None:
                    continue
                for dt, out, graph_out in zip(MOVABLE, outs, graph_outs):
                    self.assert_matches(out, values[dt][root], dt, f"{t} root {root} eager {dt.name}")
                    self.assert_matches(graph_out, values[dt][root], dt, f"{t} root {root} graph {dt.name}")

    def test_barrier_counts_joined_ranks_as_arrived(self):
        graph_barrier = tf.function(lambda: sd.barrier(name="fn.barrier"))
        for joined in JOIN_SETS:
            t = tag(joined)
            self.run_joined(joined, lambda: sd.barrier(name=f"{t}.barrier"))
            self.run_joined(joined, graph_barrier, join=JOIN_GRAPH)
            # Collectives around a barrier, from ranks that reach it at different times.
            def work():
                time.sleep(0.05 * RANK)
                sd.barrier(name=f"{t}.barrier.2")
                return sd.allreduce(tf.constant([RANK]), op=sd.Sum, name=f"{t}.after.barrier")

            out = self.run_joined(joined, work)
            if out is not None:
                self.assertAllEqual(out, [sum(contributors(joined))])


class JoinedPeerErrorTest(JoinTestCase):
    """Collectives that need a joined rank's data fail on every rank, and the engine carries on."""

    def assert_fails_everywhere(self, joined, submit, pattern="have joined", join=None, delay_join=False):
        """The others run submit() while the ranks in `joined` wait in join(): all of them raise
        FailedPreconditionError matching `pattern`, soon. Then every rank checks the engine still works."""
        start = time.monotonic()
        if RANK in joined:
            if delay_join:
                time.sleep(DELAY_S)
            with self.assertRaisesRegex(tf.errors.FailedPreconditionError, pattern):  # the submitters' error
                (join or sd.join)()
        else:
            with self.assertRaisesRegex(tf.errors.FailedPreconditionError, pattern):
                submit()
        self.assertLess(time.monotonic() - start, ERROR_S)
        self.assert_engine_healthy()

    def assert_engine_healthy(self):
        """Later collectives (every rank takes part again) and a later join() work."""
        out = sd.allreduce(tf.fill([3], RANK + 1), op=sd.Sum, name="join.healthy")
        self.assertAllEqual(out, [SIZE * (SIZE + 1) // 2] * 3)
        sd.barrier(name="join.healthy.barrier")
        self.check_last_joiner(sd.join(), range(SIZE))

    def test_alltoall(self):
        for joined in JOIN_SETS:
            t = tag(joined)
            self.assert_fails_everywhere(joined, lambda: sd.alltoall(tf.ones([2 * SIZE, 3]), name=f"{t}.alltoall"))
            self.assert_fails_everywhere(joined, lambda: sd.alltoall(tf.ones([SIZE, 2], tf.int32), splits=[1] * SIZE,
                                                                     name=f"{t}.alltoall.splits"), delay_join=True)

    def test_reducescatter(self):
        for joined in JOIN_SETS:
            t = tag(joined)
            for op in (sd.Sum, sd.Average):
                self.assert_fails_everywhere(joined, lambda: sd.reducescatter(tf.ones([2 * SIZE + 1, 2]), op=op,
                                                                              name=f"{t}.reducescatter.{op}"))

    def test_broadcast_from_a_joined_root(self):
        for joined in JOIN_SETS:
            t = tag(joined)
            for root in sorted({joined[0], joined[-1]}):
                self.assert_fails_everywhere(joined, lambda: sd.broadcast(tf.fill([4], RANK), root, name=f"{t}.bcast.joined.{root}"))

    def test_prescaled_min_max_product(self):
        values = [rank_values(r, (5,), tf.float32, seed=9) for r in range(SIZE)]
        for op in (sd.Min, sd.Max, sd.Product):
            # Allowed while no rank is joined.
            out = sd.allreduce(tf.constant(values[RANK]), op=op, prescale_factor=2.0, name=f"prescaled.{op}")
            self.assertAllClose(out, expected_reduction(values, op, tf.float32, prescale=2.0), rtol=1e-5, atol=1e-5)
            for joined in JOIN_SETS:
                t = tag(joined)
                self.assert_fails_everywhere(joined, lambda: sd.allreduce(tf.constant(values[RANK]), op=op, prescale_factor=2.0,
                                                                          name=f"{t}.prescaled.{op}"), pattern="")

    def test_after_collectives_that_completed(self):
        # The contributors' allreduce completes without the joined ranks; the alltoall after it fails everywhere.
        for joined in JOIN_SETS:
            t = tag(joined)

            done = []

            def submit():
                done.append(sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum, name=f"{t}.before.error"))
                sd.alltoall(tf.ones([SIZE]), name=f"{t}.error.after")

            self.assert_fails_everywhere(joined, submit)
            if RANK not in joined:
                self.assertAllClose(done[0], [float(sum(contributors(joined)))])

    def test_in_tf_function(self):
        alltoall = tf.function(lambda x: sd.alltoall(x, name="fn.alltoall.joined"))
        reducescatter = tf.function(lambda x: sd.reducescatter(x, op=sd.Sum, name="fn.reducescatter.joined"))
        for joined in [JOIN_SETS[0], JOIN_SETS[-1]]:
            self.assert_fails_everywhere(joined, lambda: alltoall(tf.ones([SIZE, 2])), join=JOIN_GRAPH)
            self.assert_fails_everywhere(joined, lambda: reducescatter(tf.ones([SIZE, 2])), join=JOIN_GRAPH)


class ResponseCacheTest(JoinTestCase):
    """Collectives negotiated before (held in the response cache) complete while some rank is joined."""

    def test_cached_collectives(self):
        for joined in JOIN_SETS:
            t = tag(joined)
            root = contributors(joined)[-1]
            x = rank_values(RANK, (4,), tf.float32, seed=1)
            group = [rank_values(RANK, (i + 1,), tf.int32, seed=2 + i) for i in range(3)]

            def all_kinds():
                outs = (sd.allreduce(tf.constant(x), op=sd.Sum, name=f"{t}.cached"),
                        sd.grouped_allreduce([tf.constant(g) for g in group], op=sd.Average, name=f"{t}.cached.group"),
                        sd.allgather(tf.fill([RANK % 2 + 1], RANK), name=f"{t}.cached.gather"),
                        sd.broadcast(tf.fill([2], RANK), root, name=f"{t}.cached.bcast"))
                sd.barrier(name=f"{t}.cached.barrier")
                return outs

            def check(outs, ranks, what):
                if outs is None:  # joined
                    return
                self.assertAllClose(outs[0], expected_reduction([rank_values(r, (4,), tf.float32, seed=1) for r in ranks], sd.Sum,
                                                                tf.float32), rtol=1e-5, atol=1e-5, msg=what)
                for i, out in enumerate(outs[1]):
                    values = [rank_values(r, (i + 1,), tf.int32, seed=2 + i) for r in ranks]
                    self.assertAllEqual(out, expected_reduction(values, sd.Average, tf.int32), what)
                self.assertAllEqual(outs[2], np.concatenate([np.full([r % 2 + 1], r) for r in ranks]), what)
                self.assertAllEqual(outs[3], [root, root], what)

            for n in range(3):
                check(all_kinds(), range(SIZE), f"{t} every rank, call {n}")
            check(self.run_joined(joined, all_kinds), contributors(joined), f"{t} joined")
            check(self.run_joined(joined, all_kinds, delay_join=True), contributors(joined), f"{t} joined later")
            check(all_kinds(), range(SIZE), f"{t} every rank again")

    def test_cached_in_tf_function(self):
        @tf.function
        def step(x):
            return sd.allreduce(x, op=sd.Average, name="fn.cached"), sd.allgather(x, name="fn.cached.gather")

        x = tf.fill([2], float(RANK))
        for _ in range(3):
            step(x)
        for joined in JOIN_SETS:
            outs = self.run_joined(joined, lambda: step(x), join=JOIN_GRAPH)
            if outs is not None:
                ranks = contributors(joined)
                self.assertAllClose(outs[0], [sum(ranks) / len(ranks)] * 2)
                self.assertAllEqual(outs[1], np.repeat(np.array(ranks, np.float32), 2))
        avg, _ = step(x)
        self.assertAllClose(avg, [(SIZE - 1) / 2] * 2)


class RepeatedJoinTest(JoinTestCase):
    def test_join_with_nothing_pending(self):
        for _ in range(5):
            self.check_last_joiner(sd.join(), range(SIZE))
        for _ in range(2):
            self.check_last_joiner(JOIN_GRAPH(), range(SIZE), graph=True)

    def test_uneven_batches_epoch_after_epoch(self):
        # Rank r has 2 + (r + epoch) % SIZE batches: the rank with the most joins last, a different rank each epoch.
        @tf.function
        def train_step(grads):
            return sd.grouped_allreduce(grads, op=sd.Average, name="fn.epoch.grads")

        for epoch in range(max(SIZE, 3)):
            batches = [2 + (r + epoch) % SIZE for r in range(SIZE)]
            graph = epoch % 2 == 1
            results = []
            for step in range(batches[RANK]):
                grads = [rank_values(RANK, s, tf.float32, seed=100 * epoch + 10 * step + i) for i, s in enumerate([(3,), (2, 2)])]
                if graph:
                    results.append(train_step([tf.constant(g) for g in grads]))
                else:
                    results.append(sd.grouped_allreduce([tf.constant(g) for g in grads], op=sd.Average, name="epoch.grads"))
            last = self.check_last_joiner(JOIN_GRAPH() if graph else sd.join(), range(SIZE), graph=graph)
            self.assertEqual(last, int(np.argmax(batches)), f"epoch {epoch}: batches {batches}")
            for step, outs in enumerate(results):
                ranks = [r for r in range(SIZE) if batches[r] > step]  # the others had joined
                for i, (out, s) in enumerate(zip(outs, [(3,), (2, 2)])):
                    values = [rank_values(r, s, tf.float32, seed=100 * epoch + 10 * step + i) for r in ranks]
                    self.assertAllClose(out, expected_reduction(values, sd.Average, tf.float32), rtol=1e-5, atol=1e-5,
                                        msg=f"epoch {epoch} step {step} tensor {i}")

    def test_the_rank_that_ran_collectives_joins_last(self):
        # All ranks but `lone` join at once; lone's collectives complete only once they all have.
        for lone in sorted({LAST, 0}):
            joined = tuple(r for r in range(SIZE) if r != lone)
            t = f"lone{lone}"

            x = rank_values(lone, (5,), tf.float32, seed=4)

            def work():
                outs = (sd.allreduce(tf.constant(x), op=sd.Average, name=f"{t}.avg"),
                        sd.allgather(tf.fill([2], lone), name=f"{t}.gather"),
                        sd.broadcast(tf.constant([7, 8]), lone, name=f"{t}.bcast"))
                sd.barrier(name=f"{t}.barrier")
                return outs

            outs = self.run_joined(joined, work)  # checks that every rank's join() returned lone
            if outs is not None:
                self.assertAllClose(outs[0], x, rtol=1e-6)
                self.assertAllEqual(outs[1], [lone, lone])
                self.assertAllEqual(outs[2], [7, 8])


class UnnamedEagerCollectivesTest(JoinTestCase):
    """An eager training loop as join()'s docstring describes: DistributedGradientTape (whose
    allreduces are unnamed), ranks with different numbers of batches, join() at the end of every
    epoch, then broadcast_variables(root_rank=<join's result>).

    Last in the module: if the ranks' numbering of unnamed collectives drifts apart, it stays apart.
    A stall then stops the engine (AbortedError on every rank) instead of hanging the job.
    """

    def test_eager_distributed_gradient_tape_epoch_after_epoch(self):
        with engine_with(SMDIST_STALL_SHUTDOWN_TIME="10"):
            w = tf.Variable([1.0, 2.0, 3.0])
            for epoch in range(3):
                batches = [2 + (r + epoch) % SIZE for r in range(SIZE)]
                for step in range(batches[RANK]):
                    x = tf.constant(rank_values(RANK, (3,), tf.float32, seed=50 * epoch + step))
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_sum(w * x)  # d loss / d w = x
                    (grad,) = sd.DistributedGradientTape(tape).gradient(loss, [w])
                    ranks = [r for r in range(SIZE) if batches[r] > step]
                    values = [rank_values(r, (3,), tf.float32, seed=50 * epoch + step) for r in ranks]
                    self.assertAllClose(grad, expected_reduction(values, sd.Average, tf.float32), rtol=1e-5, atol=1e-5,
                                        msg=f"epoch {epoch} step {step}")
                    w.assign_sub(0.1 * grad)
                last = self.check_last_joiner(sd.join(), range(SIZE))
                self.assertEqual(last, int(np.argmax(batches)))
                sd.broadcast_variables([w], root_rank=last)
                seen = sd.allgather(tf.expand_dims(w, 0), name="tape.weights").numpy()
                self.assertAllEqual(seen, np.repeat(seen[:1], SIZE, axis=0))


if __name__ == "__main__":
    tf.test.main()
