"""RayExecutor across two Ray nodes.

``ray.cluster_utils.Cluster`` (a head and a worker node, both on this machine): the two nodes share this
machine's host name, so the executor makes them one MPI host (one daemon, ``local_size`` 4): ranks under
two daemons of one machine would not get Open MPI's shared-memory windows. Then two hosts of their own:
a Ray head and a worker node in the suite's two network namespaces (benchmarks/netns_hosts.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from benchmarks.netns_hosts import Unavailable, two_namespace_hosts
from smdist_tf.ray import RayExecutor, RayRunError
from tests import ray_rank_fns as fns

# The example loads scikit-learn's digits; a run must end within 5 s of a node's loss (judged on a quiet machine).
pytestmark = [pytest.mark.optional_packages, pytest.mark.wall_clock]

ROOT = Path(__file__).resolve().parent.parent


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


# ---------------------------------------------------------------- two hosts as network namespaces

def _in_namespace(ns: str, hostname: str, command: list[str], log: Path, env: dict) -> subprocess.Popen:
    """``command`` inside network namespace ``ns`` with host name ``hostname`` (its own UTS namespace)."""
    return subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "/bin/bash", "-c",
                             'hostname "$1"; shift; exec "$@"', "in-ns", hostname, *command],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


@pytest.fixture
def two_netns_hosts(tmp_path):
    """Two namespaces joined by a veth pair (10.213.7.1, 10.213.7.2); removed afterwards, every process in them killed."""
    try:
        with two_namespace_hosts(tmp_path) as hosts:
            yield hosts
    except Unavailable as why:
        pytest.skip(str(why))


@pytest.fixture
def ray_temp_dir():
    """A directory of its own for the namespaces' Ray cluster (short: Ray's socket paths must fit), removed after
    the namespaces and their processes are gone; no later ray.init() on this machine finds that cluster."""
    path = tempfile.mkdtemp(prefix="smdray")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_one_rank_on_each_of_two_hosts_in_network_namespaces(ray_temp_dir, two_netns_hosts, tmp_path):
    """A Ray head on "hosta" and a worker node on "hostb": the daemon of hostb starts through its actor,
    and MPI crosses the veth pair between the namespaces."""
    h = two_netns_hosts
    # Token authentication off: a cluster of two namespaces of this machine, gone with them.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TF_CPP_MIN_LOG_LEVEL": "2"}
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts", "start", "--num-cpus", "1", "--block"]
    address = f"{h['ip_a']}:6390"
    head = _in_namespace(h["ns_a"], "hosta", [*ray_cli, "--head", "--include-dashboard=false", "--temp-dir", ray_temp_dir, "--port", "6390",
                                              "--node-ip-address", h["ip_a"]], tmp_path / "head.log", env)
    deadline = time.monotonic() + 60
    while "Ray runtime started" not in (tmp_path / "head.log").read_text():
        assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-3000:]
        time.sleep(0.2)
    _in_namespace(h["ns_b"], "hostb", [*ray_cli, "--address", address, "--node-ip-address", h["ip_b"]],
                  tmp_path / "worker.log", env)
    driver = _in_namespace(h["ns_a"], "hosta", [sys.executable, str(ROOT / "tests" / "ray_netns_driver.py"), address],
                           tmp_path / "driver.log", env)
    code = driver.wait(timeout=180)
    out = (tmp_path / "driver.log").read_text()
    assert code == 0, out[-5000:] + (tmp_path / "worker.log").read_text()[-2000:]
    actors = json.loads(re.search(r"^ACTORS (.*)$", out, re.M).group(1))
    results = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", out, re.M)]
    assert sorted(actors) == ["hosta", "hostb"], actors
    assert [(r["rank"], r["size"], r["local_size"], r["cross_rank"], r["cross_size"], r["sum"]) for r in results] == [
        (0, 2, 1, 0, 2, 3.0), (1, 2, 1, 1, 2, 3.0)]
    assert [r["hostname"] for r in results] == actors  # each rank ran on its own actor's host
