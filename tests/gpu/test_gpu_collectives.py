"""The GPU data plane on a real GPU, through the runtime module and CuPy (no TensorFlow).

Skips cleanly where there is no GPU or no CuPy (CI). Where there is one GPU: NCCL
at one rank, the host-staged path with 2 and 4 ranks sharing the GPU, the refusal
of two ranks on one GPU under NCCL, NCCL in process sets of one rank each, and the
hierarchical allreduce with each rank posing as a host of its own. The multi-rank NCCL case needs one GPU
per rank and runs only where there are that many. These are ``unittest`` cases:
the GPU machine has no TensorFlow, so ``tf.test.TestCase`` is not available there.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.process_group import run_process_group  # noqa: E402

SCRIPT = REPO / "tests" / "gpu" / "gpu_ranks.py"


def gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device
        return 0


def mpirun() -> str:
    home = os.environ.get("SMDIST_MPI_HOME")
    found = str(Path(home) / "bin" / "mpirun") if home else shutil.which("mpirun")
    if not found:
        raise unittest.SkipTest("no mpirun")
    return found


def run_rank_script(script: Path, ok_marker: str, np: int, mode: str, env: dict | None = None,
                    timeout: float = 120) -> str:
    """Runs `script mode [runtime dir]` at `np` ranks with a timeline; returns the output after checking
    that every rank printed `<ok_marker> <mode> <rank>`."""
    tmp = tempfile.mkdtemp(prefix="smdist_gpu_")
    full_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    SMDIST_TIMELINE=str(Path(tmp) / "timeline.{rank}.json"), **(env or {}))
    cmd = [mpirun(), "-np", str(np), "--oversubscribe", "--bind-to", "none", sys.executable, str(script), mode]
    if full_env.get("SMDIST_RUNTIME_DIR"):
        cmd.append(full_env["SMDIST_RUNTIME_DIR"])
    try:
        code, out = run_process_group(cmd, REPO, full_env, timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert code == 0, f"{mode} at {np} ranks failed (exit {code}):\n{out[-8000:]}"
    for rank in range(np):
        assert f"{ok_marker} {mode} {rank}" in out, out[-8000:]
    return out


def run_ranks(np: int, mode: str, env: dict | None = None, timeout: float = 120) -> str:
    """Runs gpu_ranks.py at `np` ranks; returns the output after checking every rank passed."""
    return run_rank_script(SCRIPT, "GPU-RANKS OK", np, mode, env, timeout)


@unittest.skipIf(gpu_count() == 0, "no GPU (or no CuPy) here")
class OneGpuTest(unittest.TestCase):
    def test_nccl_one_rank_every_dtype_and_op(self):
        run_ranks(1, "nccl")

    def test_host_staged_path_with_two_ranks_sharing_the_gpu(self):
        run_ranks(2, "staged", {"SMDIST_GPU_OPERATIONS": "MPI"})

    def test_host_staged_path_with_four_ranks_sharing_the_gpu(self):
        run_ranks(4, "staged", {"HOROVOD_GPU_OPERATIONS": "MPI"})

    def test_two_ranks_on_one_gpu_under_nccl_fail_alike_and_the_engine_goes_on(self):
        run_ranks(2, "refused")

    def test_each_process_set_gets_its_own_nccl_communicator(self):
        run_ranks(2, "process_sets")

    def test_hierarchical_allreduce_nccl_inside_hosts_and_mpi_across(self):
        run_ranks(2, "hierarchical")


@unittest.skipIf(gpu_count() < 2, "multi-rank NCCL needs one GPU per rank")
class MultiGpuTest(unittest.TestCase):
    def test_nccl_two_ranks_each_on_its_own_gpu(self):
        run_ranks(2, "multi_gpu")


if __name__ == "__main__":
    unittest.main()
