"""Allreduce among the ranks of one host: shared memory, cross-memory attach, the shared output arena,
the thresholds that choose between them, and wire compression on every path.

Run on every rank by tests/test_collectives_multiprocess.py, in one job with suite_errors.py and
suite_fusion.py. Each test restarts the engine with the settings it needs and restores them.
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.engine_restart import restart_engine
from tests.mp.collective_expectations import all_rank_values, expected_reduction

RANK, SIZE = sd.rank(), sd.size()


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


if __name__ == "__main__":
    tf.test.main()
