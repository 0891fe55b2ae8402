"""smdist_tf on a real Slurm: a one-node cluster started by the test (tests/slurm_cluster.py).

``sbatch`` runs ``smdistrun`` with no -np and no hosts: it takes the node and its two slots from the
allocation's environment, and the ranks train. ``srun --mpi=pmix`` starts the ranks itself, through
Slurm's PMIx server, with no mpirun. Skipped, saying why, where Slurm is not installed or we are not root.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.mpi_harness import ROOT
from tests.slurm_cluster import Unavailable, one_node_slurm, run_batch

pytestmark = pytest.mark.optional_packages  # the example loads scikit-learn's digits


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """(the node's name, the environment Slurm's commands need)."""
    try:
        with one_node_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster
    except Unavailable as why:
        pytest.skip(str(why))


def test_sbatch_runs_smdistrun_which_takes_its_ranks_from_the_allocation(slurm, tmp_path):
    script = f"""#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --time=10
cd {ROOT}
smdistrun --verbose {sys.executable} examples/keras_digits.py --epochs 1
"""
    node, env = slurm
    state, out = run_batch(script, env, tmp_path, timeout=400)
    assert state == "COMPLETED", out[-5000:]
    assert f"smdistrun: slurm detected: hosts {node}:2" in out, out[-5000:]
    assert "training on 2 rank(s)" in out and "weights identical on all ranks: True" in out, out[-5000:]


def test_srun_starts_the_ranks_through_pmix_without_mpirun(slurm):
    cmd = ["srun", "--mpi=pmix", "-n", "2", "--time=5", sys.executable, str(ROOT / "tests" / "mp" / "srun_ranks.py")]
    done = subprocess.run(cmd, env=slurm[1], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if "Couldn't load specified plugin name for mpi/pmix" in done.stderr:
        pytest.skip("Slurm's PMIx plugin cannot load its library here: apt-get install libpmix-dev")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(re.findall(r"^SRUN (.*)$", done.stdout, re.M))
    assert lines == ["0 2 0 2 3", "1 2 1 2 3"], done.stdout + done.stderr

