"""Starts a test suite under mpirun, one process per rank, and reports its outcome.

Each suite in tests/mp/ is an ordinary pytest module that every rank runs in
full: one mpirun (and one TensorFlow import per rank) covers many tests.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Sequence

import smdist_tf
from tests.process_group import run_process_group  # noqa: F401 - the suites' entry point too
from smdist_tf.run.session_dir import BASE_VARIABLE, private_session_base

ROOT = Path(__file__).resolve().parent.parent
MP_DIR = Path(__file__).resolve().parent / "mp"


def mpirun_path() -> str:
    """The mpirun of the MPI smdist_tf was built with."""
    mpicxx = Path(smdist_tf.get_build_info()["mpicxx"])
    return str(mpicxx.parent / "mpirun")


def mpi_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def run_under_mpi(np: int, argv: list[str], timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Runs ``python argv...`` on ``np`` ranks; returns (exit code, combined output)."""
    cmd = [mpirun_path(), "-np", str(np), "--oversubscribe", "--bind-to", "none", sys.executable, *argv]
    with private_session_base(BASE_VARIABLE, mpi_env(env)) as job_env:
        return run_process_group(cmd, ROOT, job_env, timeout)


def run_suite(suites: str | Sequence[str], np: int, timeout: float, env: dict | None = None) -> str:
    """Runs tests/mp/<suite> (or several suites, in one job) with pytest on every rank.

    Fails with the ranks' output unless every rank passed: ``timeout`` bounds the whole job, and
    ``env`` is set in each rank's environment before Python starts (before TensorFlow is imported).
    """
    suites = [suites] if isinstance(suites, str) else list(suites)
    paths = [str(MP_DIR / suite) for suite in suites]
    code, out = run_under_mpi(np, ["-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", "--color=no", "-W",
                                   "ignore::DeprecationWarning"], timeout, env)
    name = " + ".join(suites)
    if code != 0:
        raise AssertionError(f"{name} with {np} ranks failed (exit {code}):\n{out[-20000:]}")
    # Each rank prints its own pytest summary; all of them must have run tests.
    summaries = re.findall(r"^=*\s*(\d+) passed", out, re.M)
    if len(summaries) != np or not all(int(n) > 0 for n in summaries):
        raise AssertionError(f"{name}: expected {np} rank summaries with passing tests:\n{out[-5000:]}")
    return out
