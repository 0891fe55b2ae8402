"""Optimizer-state and parameter sharding across 2 and 4 ranks, and checkpoints that move between rank counts."""

from tests.mpi_harness import STALL_SHUTDOWN_JOB, run_under_mpi


# Dynamic process sets: one test shards over a set it adds.
SHARDING = STALL_SHUTDOWN_JOB.add("suite_sharding.py", timeout=900)  # one job with the other such suites
PARAMETER_SHARDING = STALL_SHUTDOWN_JOB.add("suite_parameter_sharding.py", timeout=300)  # stage 3, same job


@STALL_SHUTDOWN_JOB.driver()
def test_sharding_suite(np):
    STALL_SHUTDOWN_JOB.run(SHARDING, np)


@STALL_SHUTDOWN_JOB.driver()
def test_parameter_sharding_suite(np):
    STALL_SHUTDOWN_JOB.run(PARAMETER_SHARDING, np)


def test_checkpoint_saved_at_one_rank_count_resumes_at_another(tmp_path):
    # 2 -> 4 -> 2: the 4-rank job resumes the 2-rank file and saves the one the last job resumes.
    script = "tests/mp/sharding_checkpoint_ranks.py"
    for np, mode in ((2, "save"), (4, "resume-and-save"), (2, "resume")):
        code, out = run_under_mpi(np, [script, mode, str(tmp_path)], timeout=300)
        assert code == 0, out[-5000:]
        if mode != "save":
            assert out.count(f"resumed at {np} ranks: state equal True, weights match True") == np, out[-3000:]
            assert out.count(f"stage 3 resumed at {np} ranks: weights equal True, trained match True") == np, \
                out[-3000:]
        if mode != "resume":
            assert out.count(f"saved at {np} ranks") == np, out[-3000:]
