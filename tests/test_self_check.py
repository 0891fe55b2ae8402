"""``python -m smdist_tf.check`` (and ``smdistrun --check-build``) on this CPU machine.

The GPU checks cannot run here; what can: the report says what this CPU build has, ``--gpu``
refuses with exit 2 and the reason, and one check (the child ``--gpu`` starts per path)
runs a real allreduce and reads the timeline, with TensorFlow placing it on the CPU; the
offload check compares gradients there (its memory figures need a GPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import tensorflow as tf

from tests.mpi_harness import ROOT, mpi_env


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smdist_tf.check", *args], cwd=ROOT, env=mpi_env(),
                          capture_output=True, text=True, timeout=180)


class SelfCheckTest(tf.test.TestCase):
    def test_the_report_says_what_this_cpu_build_has_and_what_merely_loads(self):
        done = _check()
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        out = done.stdout
        for line in ("[X] CPU", "[ ] GPU (CPU variant", "[X] XLA_CPU_JIT", "[ ] XLA_GPU_JIT",
                     "[X] XLA handler library (libsmdist_xla.so)", "Loads on this machine (used only by GPU kernels):",
                     "[ ] NCCL (GPU tensors on the GPU)", "GPUs TensorFlow sees: 0", "mpirun:"):
            self.assertIn(line, out)

    def test_smdistrun_check_build_prints_the_same_report(self):
        done = subprocess.run([str(Path(sys.executable).parent / "smdistrun"), "--check-build"], cwd=ROOT,
                              env=mpi_env(), capture_output=True, text=True, timeout=180)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("XLA lowerings (jit_compile):", done.stdout)
        self.assertIn("[ ] XLA_GPU_JIT", done.stdout)

    def test_gpu_checks_without_a_gpu_exit_2_with_the_reason(self):
        done = _check("--gpu")
        self.assertEqual(done.returncode, 2, done.stdout[-3000:] + done.stderr[-3000:])
        self.assertIn("TensorFlow sees no GPU here", done.stdout)

    def test_one_path_check_runs_a_real_allreduce_and_reads_the_timeline(self):
        for path in ("nccl", "xla"):
            with tempfile.TemporaryDirectory() as tmp:
                done = _check("--run-path", path, "--gpu-index", "0", "--timeline", str(Path(tmp) / "t.json"))
                self.assertEqual(done.returncode, 0, done.stderr[-3000:])
                result = json.loads(done.stdout.strip().splitlines()[-1])
                self.assertTrue(result["ok"], result)
                self.assertEqual(result["result"], [1.0, 2.0, 3.0, 4.0])
                self.assertIn("CPU", result["device"])  # no GPU here: TensorFlow placed it on the CPU
                self.assertIsInstance(result["timeline_paths"], list)

    def test_offload_check_compares_gradients_and_skips_memory_without_a_gpu(self):
        from smdist_tf.check import _check_offload

        result = _check_offload(0)  # in this process: what the child would run, without its start-up
        self.assertTrue(result["ok"], result)
        self.assertTrue(result["same_gradients"], result)
        self.assertIsNone(result["peak_bytes_offloaded"])  # GPU memory: a GPU matter


if __name__ == "__main__":
    tf.test.main()
