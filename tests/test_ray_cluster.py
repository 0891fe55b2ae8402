"""RayExecutor across two Ray nodes (``ray.cluster_utils.Cluster``: a head and a worker node, both on this machine).

The two nodes share this machine's host name, so the executor makes them one MPI host (one daemon,
``local_size`` 4): ranks under two daemons of one machine would not get Open MPI's shared-memory windows.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from smdist_tf.ray import RayExecutor, RayRunError
from tests import ray_rank_fns as fns


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    worker = made.add_node(num_cpus=2)
    ray.init(address=made.address, log_to_driver=False)
    made.wait_for_nodes()
    try:
        yield made, worker
    finally:
        ray.shutdown()
        made.shutdown()


@pytest.fixture
def deadline():
    """Interrupts a run that takes longer than `seconds` (SIGINT: the executor stops its MPI job)."""
    timers = []

    def arm(seconds: float) -> None:
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
        timer.daemon = True
        timer.start()
        timers.append(timer)

    yield arm
    for timer in timers:
        timer.cancel()


def test_two_ranks_on_each_of_two_nodes_form_one_job(cluster, deadline):
    deadline(90)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=2)
    executor.start()
    try:
        nodes = [n["node_id"] for n in executor._nodes]
        assert len(set(nodes)) == 2 and nodes[0] == nodes[1] and nodes[2] == nodes[3], nodes
        results = executor.run(fns.topology_and_sum)
    finally:
        executor.shutdown()
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"], r["sum"]) for r in results] == [
        (r, 4, r, 4, 10.0) for r in range(4)]


def test_a_lost_node_ends_the_run_naming_a_rank_on_it(cluster, tmp_path, deadline):
    deadline(90)
    made, worker = cluster
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=1)
    executor.start()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            executor.run(fns.allreduce_until_stopped, args=(str(tmp_path),))
        except BaseException as e:  # noqa: BLE001 - the test checks what it was
            failure.append(e)

    thread = threading.Thread(target=run)
    try:
        thread.start()
        while not all((tmp_path / f"started.{r}").exists() for r in range(2)):
            assert thread.is_alive(), failure
            time.sleep(0.1)
        on_worker = [r for r, n in enumerate(executor._nodes) if n["node_id"] == worker.node_id]
        lost_at = time.monotonic()
        made.remove_node(worker)
        thread.join(timeout=30)
        took = time.monotonic() - lost_at
    finally:
        executor.shutdown()
    assert len(failure) == 1 and isinstance(failure[0], RayRunError), failure
    assert failure[0].failed_rank in on_worker and "the Ray actor of rank" in str(failure[0]), failure[0]
    assert took < 5.0, f"the run ended {took:.1f} s after the node was lost"
