"""The XLA handlers (cc_ops/xla) run by a real XLA runtime: JAX's, from ``jax.jit``.

TensorFlow's XLA calls the same handlers (cc_ops/tf/xla_handler_registration.cc); JAX
drives them here because the GPU machine has JAX but no TensorFlow. On the CPU (CI) the
"Host" handler runs through JAX's CPU backend at 1, 2 and 4 ranks; where JAX has a GPU
the "CUDA" handler runs at 1 rank over NCCL and at 2 and 4 ranks sharing the GPU over the
host-staged path. Every rank checks every result against NumPy (tests/gpu/xla_ranks.py).
``unittest`` cases, as the GPU machine has no ``tf.test``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.gpu.test_gpu_collectives import gpu_count, run_rank_script  # noqa: E402

pytestmark = pytest.mark.jax_packages  # JAX drives the XLA handlers

SCRIPT = REPO / "tests" / "gpu" / "xla_ranks.py"
HAS_JAX = importlib.util.find_spec("jax") is not None


@functools.lru_cache(maxsize=1)
def jax_sees_a_gpu() -> bool:
    if not HAS_JAX or gpu_count() == 0:
        return False
    probe = subprocess.run([sys.executable, "-c", "import jax; print(len(jax.devices('gpu')))"],
                           capture_output=True, text=True, env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    return probe.returncode == 0 and probe.stdout.strip() not in ("", "0")


def run_ranks(np: int, mode: str, env: dict | None = None, timeout: float = 180) -> str:
    """Runs xla_ranks.py at `np` ranks; a rank still running 30 s before the timeout prints its stacks."""
    return run_rank_script(SCRIPT, "XLA-RANKS OK", np, mode,
                           {"XLA_RANKS_STACKS_AFTER": str(timeout - 30), **(env or {})}, timeout)


@unittest.skipUnless(HAS_JAX, "no JAX here")
class XlaHostHandlerTest(unittest.TestCase):
    def test_one_rank(self):
        run_ranks(1, "cpu")

    def test_two_ranks(self):
        run_ranks(2, "cpu")

    def test_four_ranks(self):
        run_ranks(4, "cpu")


@unittest.skipUnless(jax_sees_a_gpu(), "JAX sees no GPU here")
class XlaCudaHandlerTest(unittest.TestCase):
    def test_nccl_at_one_rank(self):
        run_ranks(1, "nccl")

    def test_host_staged_path_with_two_ranks_sharing_the_gpu(self):
        run_ranks(2, "staged", {"SMDIST_GPU_OPERATIONS": "MPI"})

    def test_host_staged_path_with_four_ranks_sharing_the_gpu(self):
        run_ranks(4, "staged", {"SMDIST_GPU_OPERATIONS": "MPI"})


if __name__ == "__main__":
    unittest.main()
