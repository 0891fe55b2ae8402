"""smdist_tf.ray.RayExecutor on a real local Ray cluster (``ray.init(num_cpus=2)``, shared by every test).

The ranks run tests/ray_rank_fns.py's functions. Tests run in file order and share one
executor of 2 ranks; the last one shuts it down and checks that nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray

from smdist_tf.ray import RayExecutor, RayRunError
from smdist_tf.ray.shm_sweep import SHM_DIR, paths_in_use
from tests import ray_rank_fns as fns

# The example loads scikit-learn's digits; a run must end within 5 s of an actor's death (judged on a quiet machine).
pytestmark = [pytest.mark.optional_packages, pytest.mark.wall_clock]

ROOT = Path(__file__).resolve().parent.parent


def _processes_of_ours() -> list[str]:
    """Actors, MPI daemons, agents and ranks an executor of this tree started (there must be none after shutdown)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=10).stdout
    ours = str(ROOT / "smdist_tf" / "ray")
    return [line for line in out.splitlines() if "ray::RankWorker" in line or ours in line]


def _shm_files() -> set[str]:
    """The files MPI makes in /dev/shm: Open MPI's segments and PMIx's (Ray's own go with ray.shutdown)."""
    return {os.path.join(SHM_DIR, name) for name in os.listdir(SHM_DIR)
            if name.startswith(("sm_segment.", "vader_segment.", "pmix"))}


@pytest.fixture(scope="module")
def executor():
    """One Ray cluster and one 2-rank executor for the whole module."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # 4 logical CPUs: the module's executor holds 2, the example's driver reserves 2 more.
    # address="local": a cluster of its own, never one that `ray start` left on this machine.
    context = ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    shm_before = _shm_files()
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2, cpus_per_worker=1)
    ex.start()
    ex.shm_before = shm_before  # for the last test
    ex.ray_address = context.address_info["address"]
    try:
        yield ex
    finally:
        ex.shutdown()
        ray.shutdown()



def test_the_keras_example_gives_the_weights_of_the_same_training_under_smdistrun(executor, tmp_path):
    """examples/ray_keras.py (a fit under DataParallelStrategy in executor.run) joins the test's cluster."""
    env = {**os.environ, "RAY_ADDRESS": executor.ray_address,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ["PYTHONPATH"]}  # the example's scikit-learn
    under_ray, under_smdistrun = tmp_path / "ray.npz", tmp_path / "smdistrun.npz"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "ray_keras.py"), "--save-weights", str(under_ray)],
                          capture_output=True, text=True, timeout=150, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert [line.split(",")[0] for line in lines] == ["rank 0/2: local rank 0/2", "rank 1/2: local rank 1/2"], done.stdout

    done = subprocess.run([sys.executable, "-m", "smdist_tf.run", "-np", "2", sys.executable,
                           str(ROOT / "tests" / "ray_rank_fns.py"), str(under_smdistrun)],
                          capture_output=True, text=True, timeout=150, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    a, b = np.load(under_ray), np.load(under_smdistrun)
    assert a.files == b.files and len(a.files) == 4
    for name in a.files:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6)


def test_results_come_back_in_rank_order_with_args_and_kwargs(executor, deadline):
    deadline(60)
    results = executor.run(fns.allreduce_ranks)
    assert results == [{"rank": r, "size": 2, "local_rank": r, "sum": 1.0} for r in range(2)]
    assert executor.run(lambda a, b=0: (a, b), args=(3,), kwargs={"b": 4}) == [(3, 4), (3, 4)]
    assert executor.execute(lambda executable: executable) == [None, None]


def test_an_exception_on_a_rank_is_raised_in_the_driver_naming_the_rank(executor, deadline):
    deadline(60)
    with pytest.raises(RayRunError, match=r"(?s)rank 1 .*exited with code 1.*ValueError: rank one refuses") as info:
        executor.run(fns.raise_on_rank_one)
    assert info.value.failed_rank == 1 and info.value.exit_code == 1
    # The same actors run the next job.
    assert [r["sum"] for r in executor.run(fns.allreduce_ranks)] == [1.0, 1.0]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.parametrize("victim", [0, 1], ids=["the actor running the node's MPI daemon", "another actor"])
def test_a_killed_actor_ends_the_run_on_every_rank_within_5_s(executor, victim, tmp_path, deadline):
    deadline(90)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            executor.run(fns.allreduce_until_stopped, args=(str(tmp_path),))
        except BaseException as e:  # noqa: BLE001 - the test checks what it was
            failure.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    markers = [tmp_path / f"started.{r}" for r in range(2)]
    while not all(m.exists() and m.read_text() for m in markers):
        assert thread.is_alive(), failure
        time.sleep(0.1)
    rank_pids = [int(m.read_text()) for m in markers]
    actor_pid = executor._nodes[victim]["pid"]
    killed_at = time.monotonic()
    os.kill(actor_pid, signal.SIGKILL)
    thread.join(timeout=30)
    took = time.monotonic() - killed_at
    assert not thread.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], RayRunError), failure
    assert failure[0].failed_rank == victim and f"the Ray actor of rank {victim}" in str(failure[0]), failure[0]
    assert took < 5.0, f"the run ended {took:.1f} s after the actor died"
    # Within the same 5 s: the run may end (the agents report) a moment before the kernel has
    # taken down every rank process, and a dead one waits as a zombie until its new parent reaps it.
    while any(process_alive(pid) for pid in rank_pids) and time.monotonic() - killed_at < 5.0:
        time.sleep(0.05)
    for pid in rank_pids:
        assert not process_alive(pid), f"rank process {pid} outlived the run by 5 s"

    # The next run starts new actors in place of the dead one; the dead job's /dev/shm files were removed.
    assert _shm_files() - executor.shm_before - paths_in_use() == set()
    assert [r["sum"] for r in executor.run(fns.allreduce_ranks)] == [1.0, 1.0]


def test_shutdown_leaves_no_process_actor_or_shared_memory_file(executor):
    group = executor._placement_group
    executor.shutdown()
    deadline = time.monotonic() + 15
    while _processes_of_ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of_ours() == []
    assert ray.util.placement_group_table(group)["state"] == "REMOVED"
    # Files other users' live jobs hold (the machine is shared) are not ours to judge.
    assert _shm_files() - executor.shm_before - paths_in_use() == set()
