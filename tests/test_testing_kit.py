"""smdist_tf.testing: DistributedTestCase and @pytest.mark.distributed, run as a user runs them.

The cases live in tests/testing_kit/ (not collected here: their names do not start
with test_). Each is run in a fresh pytest (or as a script with tf.test.main()),
whose real smdistrun jobs start 2 and 4 ranks.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.mpi_harness import ROOT, mpi_env

KIT = ROOT / "tests" / "testing_kit"


def run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                          timeout=timeout)


def pytest_outcomes(result: subprocess.CompletedProcess) -> dict[str, str]:
    """test id -> PASSED / FAILED / SKIPPED, from pytest -rA's summary."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^(PASSED|FAILED|SKIPPED)\s+\S*?::(\S+)", result.stdout, re.M)}


class DistributedTestCaseTest(tf.test.TestCase):
    def test_methods_run_on_every_rank_and_pass(self):
        result = run("-m", "pytest", "-rA", "-p", "no:cacheprovider", str(KIT / "cases_pass.py"))
        self.assertEqual(result.returncode, 0, result.stdout[-5000:] + result.stderr[-3000:])
        outcomes = pytest_outcomes(result)
        self.assertEqual(outcomes["AllreduceOnTwoRanks::test_sum_equals_the_local_result"], "PASSED")
        self.assertEqual(outcomes["AllreduceOnTwoRanks::test_broadcast_from_the_last_rank"], "PASSED")
        # Skipped because every rank skipped it.
        self.assertRegex(result.stdout, r"SKIPPED \[1\] \S+cases_pass.py:\d+: not on any rank")
        self.assertNotIn("::DistributedTestCase::", result.stdout)  # the base class is not collected
        self.assertNotIn("test_session", result.stdout)  # tf.test.TestCase's TF1 helper is no test

    # A 6 s start-up limit must catch rank 0's stuck setUpClass, not a start-up slowed by a background job.
    @pytest.mark.wall_clock
    def test_failures_name_their_rank_and_a_hang_fails_within_the_timeout(self):
        result = run("-m", "pytest", "-rA", "-p", "no:cacheprovider", str(KIT / "cases_fail.py"))
        self.assertEqual(result.returncode, 1, result.stdout[-5000:])
        outcomes = pytest_outcomes(result)
        self.assertEqual(outcomes["FailsOnSomeRanks::test_passes"], "PASSED")
        out = result.stdout
        self.assertRegex(out, r"test_assertion_on_rank_one failed:\s+E?\s*rank 1 of 2:[\s\S]*only rank 0 gets here")
        self.assertNotRegex(out, r"test_assertion_on_rank_one failed:\s+E?\s*rank 0 of 2")
        self.assertRegex(out, r"test_exception_on_rank_zero failed:\s+E?\s*rank 0 of 2:[\s\S]*ValueError: rank zero")
        self.assertIn("test_a_hang failed:", out)
        self.assertRegex(out, r"did not finish on rank\(s\) [0-9, ]*1[0-9, ]* of 2 within 8 s")
        # The stuck rank's stacks are in the hung test's own failure, not in another test's output.
        hang = out[out.index("test_a_hang failed:"):]
        self.assertRegex(hang[:hang.index("test_b_after_the_hang")],
                         r"rank 1's stacks when it was stopped:\s+E?\s*Timeout \([\d:.]+\)![\s\S]*"
                         r"cases_fail\.py\", line 32 in test_a_hang")
        self.assertRegex(out, r"test_b_after_the_hang failed:\s+E?\s*never ran on rank\(s\) 0, 1 of 2")
        # A start-up that outlasts startup_timeout ends the job before any test.
        self.assertRegex(out, r"test_never_reached failed:\s+E?\s*never ran on rank\(s\) 0(, 1)? of 2: smdist_tf.run: rank 0")
        # The wrapper's and unittest's own frames are left out of the ranks' tracebacks.
        message = out[out.index("test_assertion_on_rank_one failed:"):out.index("only rank 0 gets here")]
        self.assertNotIn("unittest", message)
        self.assertIn("cases_fail.py", message)

    def test_the_example_passes_as_a_script_with_tf_test_main(self):
        result = run("-W", "always::ResourceWarning", str(ROOT / "examples" / "distributed_tests.py"))
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-5000:])
        self.assertRegex(result.stderr, r"Ran \d+ tests[\s\S]*OK")
        self.assertNotIn("ResourceWarning", result.stderr)  # the launcher closes mpirun's pipes


class DistributedMarkerTest(tf.test.TestCase):
    def test_marked_functions_run_on_their_ranks(self):
        result = run("-m", "pytest", "-rA", "-p", "no:cacheprovider", str(KIT / "marker_cases.py"))
        self.assertEqual(result.returncode, 1, result.stdout[-5000:])
        outcomes = pytest_outcomes(result)
        self.assertEqual(outcomes["test_allreduce_sum"], "PASSED")
        self.assertEqual(outcomes["test_broadcast_parametrized[0]"], "PASSED")
        self.assertEqual(outcomes["test_broadcast_parametrized[1]"], "PASSED")
        self.assertEqual(outcomes["test_fails_on_rank_one"], "FAILED")
        self.assertEqual(outcomes["test_shares_the_job_of_the_earlier_tests_with_its_settings"], "PASSED")
        # The np=2 job ran its three tests together (rank 0's pytest summary), apart from the env job's pair.
        summaries = re.findall(r"^\[0\]<stdout>:(\d+) passed in", result.stdout, re.M)
        self.assertIn("3", summaries, result.stdout[-5000:])
        self.assertIn("2", summaries, result.stdout[-5000:])
        # A hang ends its shared job: the hung test names the rank, the next one in the job never ran there.
        self.assertEqual(outcomes["test_hangs_on_rank_one"], "FAILED")
        self.assertRegex(result.stdout, r"test_hangs_on_rank_one failed:\s+E?\s*did not finish on rank\(s\) 1 of 2 within 8 s")
        self.assertEqual(outcomes["test_after_the_hang_in_the_same_job"], "FAILED")
        self.assertRegex(result.stdout, r"test_after_the_hang_in_the_same_job failed:\s+E?\s*never ran on rank\(s\) [0, ]*1 of 2")
        self.assertIn("rank 1 of 2:", result.stdout)
        self.assertIn("AssertionError: rank 1 was not meant to get here", result.stdout)

    def test_the_plugin_leaves_tensorflow_unimported(self):
        # pytest loads it in every session of an environment where smdist_tf is installed.
        result = run("-c", "import sys, smdist_tf.testing.pytest_plugin\n"
                           "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)[:5]",
                     timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])


if __name__ == "__main__":
    tf.test.main()
