"""A lone process (no launcher) is a job of size 1; build checks and pre-init errors.

Runs inside the pytest process, so these tests also prove that scripts run
unchanged on a laptop without mpirun.
"""

import ast
import ctypes
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf._native import check_tensorflow_version, rebuild_hint
from tests.mpi_harness import ROOT, mpi_env


def run_python(code: str) -> subprocess.CompletedProcess:
    env = mpi_env()
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


class StoppedEngineTest(tf.test.TestCase):
    def test_cached_names_of_a_stopped_engine_is_an_error_not_an_empty_cache(self):
        result = run_python(
            "import tensorflow as tf, smdist_tf as sd\n"
            "from smdist_tf import _native\n"
            "runtime = _native.load()[0]\n"
            "sd.init()\n"
            "sd.allreduce(tf.ones([2]), op=sd.Sum, prescale_factor=2.0, name='cached')\n"
            "assert 'cached' in runtime._cached_names()\n"
            "sd.shutdown()\n"
            "try:\n"
            "    runtime._cached_names()\n"
            "except RuntimeError as e:\n"
            "    print('raised:', e)\n"
            "else:\n"
            "    raise SystemExit('a stopped engine reported a cache')\n"
        )
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("raised:", result.stdout)


class BeforeInitTest(tf.test.TestCase):
    def test_collective_before_init_raises_clear_error(self):
        result = run_python(
            "import tensorflow as tf, smdist_tf as sd\n"
            "for call in [lambda: sd.allreduce(tf.ones([2])), lambda: sd.allgather(tf.ones([2])), lambda: sd.barrier(), lambda: sd.rank()]:\n"
            "    try:\n"
            "        call()\n"
            "    except ValueError as e:\n"
            "        assert 'call smdist_tf.init()' in str(e), e\n"
            "    else:\n"
            "        raise SystemExit('no error')\n"
            "from smdist_tf._native import op_module\n"
            "try:\n"
            "    op_module.smdist_allreduce(tensors=[tf.ones([2])], reduce_op=1, tensor_name='raw')\n"
            "except tf.errors.FailedPreconditionError as e:\n"
            "    assert 'not been initialized' in e.message\n"
            "else:\n"
            "    raise SystemExit('kernel did not refuse')\n"
            "print('OK')\n"
        )
        self.assertIn("OK", result.stdout, result.stderr[-3000:])


def loads(forced: str | None, *sonames: str) -> bool:
    """Whether the dynamic loader finds a library the way the engine looks for it (a named path wins)."""
    for name in [forced] if forced else sonames:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


class BuildTest(tf.test.TestCase):
    def test_build_introspection(self):
        self.assertTrue(sd.mpi_built())
        # NCCL and the CUDA runtime are loaded at run time: the flags say whether they load on this machine.
        cuda = loads(os.environ.get("SMDIST_CUDA_RUNTIME_LIBRARY"), "libcudart.so.13", "libcudart.so.12", "libcudart.so")
        nccl = loads(os.environ.get("SMDIST_NCCL_LIBRARY"), "libnccl.so.2", "libnccl.so")
        self.assertEqual(sd.cuda_built(), cuda)
        self.assertEqual(bool(sd.nccl_built()), nccl and cuda)  # NCCL's version code, as Horovod's, or 0
        info = sd.get_build_info()
        self.assertEqual(info["tensorflow_version"], tf.__version__)
        self.assertIn(info["mpi_flavour"], ("openmpi", "mpich"))

    def test_tensorflow_version_mismatch_gives_a_rebuild_command_that_exists(self):
        check_tensorflow_version("2.21.0", "2.21.0")
        with self.assertRaisesRegex(ImportError, "built against TensorFlow 2.20.0 but TensorFlow 2.21.0 is installed: rebuild") as raised:
            check_tensorflow_version("2.20.0", "2.21.0")
        # In a checkout: this Python reinstalling the checkout in place, by absolute paths (works from any
        # directory; the build recompiles what a changed TensorFlow touches, see docs/installation.md#rebuilding).
        command = shlex.split(re.search(r"`([^`]+)`", str(raised.exception)).group(1))
        self.assertEqual(command, [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e",
                                   str(ROOT)])
        self.assertTrue((Path(command[-1]) / "CMakeLists.txt").is_file())
        self.assertNotIn("-e .", str(raised.exception))

    def test_installed_copy_is_told_to_reinstall_from_source(self):
        hint = rebuild_hint(Path(self.get_temp_dir()) / "site-packages" / "smdist_tf")
        self.assertIn(f"{sys.executable} -m pip install --no-build-isolation --no-deps .", hint)
        self.assertIn("source directory", hint)
        self.assertIn("wheel built for the installed TensorFlow", hint)

    def test_import_refuses_other_tensorflow_build(self):
        # Simulate a stale build by pointing the record at another version.
        result = run_python(
            "import json, pathlib, smdist_tf._native as n\n"
            "import tensorflow as tf\n"
            "n.read_build_info = lambda: {'tensorflow_version': '1.0.0'}\n"
            "try:\n"
            "    n.load()\n"
            "except ImportError as e:\n"
            "    print('REFUSED', e)\n"
        )
        self.assertIn("REFUSED smdist_tf was built against TensorFlow 1.0.0", result.stdout, result.stderr[-2000:])

    def test_copied_package_loads_its_own_engine(self):
        # An installed (copied) package must not reach back into the build tree for its engine.
        copy = Path(self.get_temp_dir()) / "relocated"
        shutil.copytree(ROOT / "smdist_tf", copy / "smdist_tf", ignore=shutil.ignore_patterns("__pycache__"))
        # -S leaves the .pth files unread: the editable install's import hook, which comes before PYTHONPATH,
        # would import the source tree. The rest of this process's sys.path follows the copy.
        path = [str(copy), *(p for p in sys.path if p and Path(p).resolve() != ROOT)]
        env = dict(mpi_env(), PYTHONPATH=os.pathsep.join(path))
        code = ("import smdist_tf as sd\n"
                "sd.init(); assert sd.size() == 1\n"
                "print(sd.__file__)\n"
                "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'smdist' in l}))\n")
        result = subprocess.run([sys.executable, "-S", "-c", code], cwd=copy, env=env, capture_output=True,
                                text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith(str(copy)), lines)
        loaded = ast.literal_eval(lines[1])
        self.assertTrue(any(p.endswith("libsmdist_core.so") for p in loaded), loaded)
        self.assertTrue(all(p.startswith(str(copy)) for p in loaded), loaded)


class SizeOneTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sd.init()

    def test_distributed_optimizer_inside_our_strategy_scope_raises_in_one_process_too(self):
        import keras

        import smdist_tf.keras as hvd

        with sd.DataParallelStrategy().scope(), self.assertRaisesRegex(ValueError, "inside a tf.distribute strategy"):
            hvd.DistributedOptimizer(keras.optimizers.SGD())

    def test_topology(self):
        self.assertTrue(sd.is_initialized())
        self.assertEqual((sd.size(), sd.rank(), sd.local_size(), sd.local_rank(), sd.cross_size(), sd.cross_rank()), (1, 0, 1, 0, 1, 0))
        self.assertTrue(sd.is_homogeneous())
        self.assertIsInstance(sd.mpi_threads_supported(), bool)
        config = sd.engine_config()
        self.assertEqual(config["fusion_threshold_bytes"], 64 * 1024 * 1024)
        self.assertEqual(config["stall_check_seconds"], 60.0)

    def test_collectives_are_identity_like(self):
        x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
        self.assertAllEqual(sd.allreduce(x), x)
        self.assertAllEqual(sd.allreduce(x, op=sd.Product), x)
        self.assertAllEqual(sd.allgather(x), x)
        self.assertAllEqual(sd.broadcast(x, 0), x)
        self.assertAllEqual(sd.alltoall(x), x)
        out, splits = sd.alltoall(x, splits=[2])
        self.assertAllEqual(splits, [2])
        self.assertAllEqual(sd.reducescatter(x, op=sd.Sum), x)
        self.assertEqual(len(sd.grouped_allreduce([x, x])), 2)
        sd.barrier()

    def test_allreduce_without_scaling_or_compression_skips_the_engine(self):
        from smdist_tf import _native

        runtime = _native.load()[0]
        ints = tf.constant([[7, -3], [0, 5]], tf.int32)
        halves = tf.constant([0.1, 1e-4, 3.0], tf.float16)
        for op in (sd.Average, sd.Sum, sd.Min, sd.Max, sd.Product):
            for x in (ints, halves):
                self.assertAllEqual(sd.allreduce(x, op=op, name=f"one.{op}.{x.dtype.name}"), x)
        grouped = tf.function(lambda a, b: sd.grouped_allreduce([a, b], name="one.grouped"))(ints, halves)
        self.assertAllEqual(grouped[0], ints)
        self.assertAllEqual(grouped[1], halves)
        self.assertFalse([n for n in runtime._cached_names() if n.startswith("one.")])  # the engine never saw them
        # Scaling and compression still run in the engine, with its numerics.
        self.assertAllEqual(sd.allreduce(ints, op=sd.Sum, prescale_factor=2.0, name="two.scaled"), ints * 2)
        x = tf.constant([1.0 + 2.0 ** -12], tf.float32)  # not a float16 value
        self.assertAllEqual(sd.allreduce(x, compression=sd.Compression.fp16, name="two.fp16"), [1.0])
        self.assertIn("two.scaled", runtime._cached_names())

    def test_distributed_gradient_tape_size_one(self):
        v = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = v * v
        grad = sd.DistributedGradientTape(tape).gradient(loss, [v])
        self.assertAllClose(grad, [6.0])

    def test_strategy_takes_the_input_as_it_is(self):
        # One replica on the CPU: no distributed iterator (a sixth of a small step), same training.
        import keras

        strategy = sd.DataParallelStrategy()
        x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
        self.assertIs(strategy.experimental_distribute_dataset(dataset), dataset)
        contexts = []

        def dataset_fn(context):
            contexts.append((context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync))
            return dataset

        self.assertIs(strategy.distribute_datasets_from_function(dataset_fn), dataset)
        self.assertEqual(contexts, [(1, 0, 1)])

        def train(scope):
            with scope:
                keras.utils.set_random_seed(5)
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
                model.compile(optimizer=keras.optimizers.SGD(0.1),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return model.fit(dataset, epochs=3, verbose=0).history["loss"], model.get_weights()

        losses, weights = train(strategy.scope())
        plain_losses, plain_weights = train(tf.distribute.get_strategy().scope())
        self.assertAllClose(losses, plain_losses, rtol=1e-6)
        for w, p in zip(weights, plain_weights):
            self.assertAllClose(w, p, rtol=1e-6, atol=1e-7)

    def test_compression_round_trip(self):
        x = tf.constant(np.linspace(-1, 1, 9), tf.float32)
        wire, ctx = sd.Compression.fp16.compress(x)
        self.assertEqual(wire.dtype, tf.float16)
        self.assertEqual(sd.Compression.fp16.decompress(wire, ctx).dtype, tf.float32)
        ints = tf.constant([1, 2])
        self.assertEqual(sd.Compression.fp16.compress(ints)[0].dtype, tf.int32)

    def test_init_with_comm_is_refused(self):
        with self.assertRaisesRegex(ValueError, "comm"):
            sd.init(comm=[0])


class CopyBytesTest(tf.test.TestCase):
    """The engine's bulk copy (copy_bytes.h), at the relative offsets that take its vector loop."""

    def test_copies_exactly_at_every_relative_offset(self):
        from smdist_tf import _runtime

        rng = np.random.default_rng(0)
        for size in [0, 1, 63, 64, 1023, 1024, 4096 + 12, 65536 + 3]:
            src = rng.integers(0, 256, size + 4096, dtype=np.uint8)
            for delta in list(range(0, 72, 4)) + [1, 31, 32, 4095]:
                dst = np.full(size + 8192 + 64, 7, np.uint8)
                # Destination `delta` bytes past the source, modulo 4 KiB.
                at = (src.ctypes.data - dst.ctypes.data + delta) % 4096
                for loop in (False, True):  # what this CPU takes; the AMD loop, wherever we are
                    dst[:] = 7
                    _runtime._copy_bytes(dst, at, src, 0, size, vector_loop=loop)
                    self.assertTrue(np.array_equal(dst[at:at + size], src[:size]), (size, delta, loop))
                    self.assertTrue((dst[:at] == 7).all() and (dst[at + size:] == 7).all(), (size, delta, loop))

    def test_loop_only_on_cpus_with_the_slow_case(self):
        from smdist_tf import _runtime

        with open("/proc/cpuinfo") as f:
            amd = "AuthenticAMD" in f.read()
        self.assertEqual(_runtime._cpu_has_slow_movsb_window(), amd)

    def test_bad_ranges_are_refused(self):
        from smdist_tf import _runtime

        buf = np.zeros(100, np.uint8)
        with self.assertRaisesRegex(ValueError, "outside"):
            _runtime._copy_bytes(np.zeros(10, np.uint8), 0, buf, 0, 11)
        with self.assertRaisesRegex(ValueError, "overlap"):
            _runtime._copy_bytes(buf, 10, buf, 0, 20)
        with self.assertRaisesRegex(ValueError, "contiguous"):
            _runtime._copy_bytes(np.zeros(40, np.uint8)[::2], 0, buf, 0, 4)
