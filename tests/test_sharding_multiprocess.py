"""Optimizer-state sharding across 2 and 4 ranks, and checkpoints that move between rank counts."""

import pytest

from tests.mpi_harness import STALL_SHUTDOWN_JOB, run_under_mpi


# Dynamic process sets: one test shards over a set it adds.
SHARDING = STALL_SHUTDOWN_JOB.add("suite_sharding.py", timeout=900)  # one job with the other such suites


@pytest.mark.optional_packages  # the stall-shutdown job's uneven-data suite loads scikit-learn's digits
@pytest.mark.parametrize("np", [2, 4])
def test_sharding_suite(np):
    STALL_SHUTDOWN_JOB.run(SHARDING, np)


@pytest.mark.parametrize("saved_np,resumed_np", [(2, 4), (4, 2)])
def test_checkpoint_saved_at_one_rank_count_resumes_at_another(tmp_path, saved_np, resumed_np):
    script = "tests/mp/sharding_checkpoint_ranks.py"
    code, out = run_under_mpi(saved_np, [script, "save", str(tmp_path)], timeout=300)
    assert code == 0, out[-5000:]
    assert out.count(f"saved at {saved_np} ranks") == saved_np, out[-3000:]
    code, out = run_under_mpi(resumed_np, [script, "resume", str(tmp_path)], timeout=300)
    assert code == 0, out[-5000:]
    assert out.count(f"resumed at {resumed_np} ranks: state equal True, weights match True") == resumed_np, out[-3000:]
