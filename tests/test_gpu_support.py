"""GPU support where there is no GPU (CI): what the build says about itself, and how it finds pip's GPU libraries.

The GPU data plane itself runs in tests/gpu/ (a GPU and CuPy needed). Here: NCCL and
the CUDA runtime are loaded at run time, so ``nccl_built()``/``cuda_built()`` say
whether they load on this machine, a library named by ``SMDIST_NCCL_LIBRARY`` that
cannot load is reported as absent, and pip-installed libraries are found for the engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import tensorflow as tf

from smdist_tf import _native
from tests.mpi_harness import ROOT, mpi_env


class PipGpuLibrariesTest(tf.test.TestCase):
    def test_pip_installed_nccl_and_cuda_runtime_are_named_to_the_engine(self):
        with tempfile.TemporaryDirectory() as site:
            for relative in ("nvidia/nccl/lib/libnccl.so.2", "nvidia/cuda_runtime/lib/libcudart.so.12"):
                (Path(site) / relative).parent.mkdir(parents=True)
                (Path(site) / relative).touch()
            with mock.patch.dict(os.environ, {"SMDIST_NCCL_LIBRARY": "", "SMDIST_CUDA_RUNTIME_LIBRARY": ""}):
                _native.point_at_pip_gpu_libraries(["/nonexistent", site])
                self.assertEqual(os.environ["SMDIST_NCCL_LIBRARY"], f"{site}/nvidia/nccl/lib/libnccl.so.2")
                self.assertEqual(os.environ["SMDIST_CUDA_RUNTIME_LIBRARY"],
                                 f"{site}/nvidia/cuda_runtime/lib/libcudart.so.12")

    def test_a_library_the_user_named_is_left_alone(self):
        with tempfile.TemporaryDirectory() as site:
            (Path(site) / "nvidia/nccl/lib").mkdir(parents=True)
            (Path(site) / "nvidia/nccl/lib/libnccl.so.2").touch()
            with mock.patch.dict(os.environ, {"SMDIST_NCCL_LIBRARY": "/opt/my/libnccl.so.2"}):
                _native.point_at_pip_gpu_libraries([site])
                self.assertEqual(os.environ["SMDIST_NCCL_LIBRARY"], "/opt/my/libnccl.so.2")


class MissingGpuKernelsTest(tf.test.TestCase):
    def test_gpus_with_a_cpu_only_build_are_told_how_to_build_the_gpu_variant(self):
        message = _native.missing_gpu_kernels({"gpu_kernels": False}, ["GPU:0", "GPU:1"])
        self.assertIn("sees 2 GPU(s)", message)
        self.assertIn("SMDIST_GPU=1 bash scripts/bootstrap.sh", message)

    def test_no_message_without_gpus_or_with_gpu_kernels(self):
        self.assertIsNone(_native.missing_gpu_kernels({"gpu_kernels": False}, []))
        self.assertIsNone(_native.missing_gpu_kernels({}, []))
        self.assertIsNone(_native.missing_gpu_kernels({"gpu_kernels": True}, ["GPU:0"]))


class BuildFlagsTest(tf.test.TestCase):
    def test_a_named_library_that_cannot_load_is_absent(self):
        probe = ("import smdist_tf as sd; import json; "
                 "print(json.dumps([sd.nccl_built(), sd.cuda_built()]))")
        env = mpi_env({"SMDIST_NCCL_LIBRARY": "/nonexistent/libnccl.so.2",
                       "SMDIST_CUDA_RUNTIME_LIBRARY": "/nonexistent/libcudart.so.12"})
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        self.assertEqual(out.stdout.strip().splitlines()[-1], "[0, false]")


if __name__ == "__main__":
    tf.test.main()
