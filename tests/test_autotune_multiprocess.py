"""Autotuning (SMDIST_AUTOTUNE=1 / HOROVOD_AUTOTUNE=1) on 2 and 4 real MPI ranks: tests/mp/suite_autotune.py."""

import pytest

from tests.mpi_harness import run_suite

# Small samples (one warm-up sample, two working cycles each): tuning ends within a few dozen steps.
SETTINGS = {"SMDIST_AUTOTUNE_WARMUP_SAMPLES": "1", "SMDIST_AUTOTUNE_STEPS_PER_SAMPLE": "2",
            "SMDIST_STALL_SHUTDOWN_TIME": "60"}


@pytest.mark.parametrize("np, switch", [(2, {"SMDIST_AUTOTUNE": "1"}),
                                        (4, {"HOROVOD_AUTOTUNE": "1", "SMDIST_AUTOTUNE": ""})])  # Horovod's spelling
def test_autotune_suite(np, switch, tmp_path):
    run_suite("suite_autotune.py", np, timeout=480,
              env={**SETTINGS, **switch, "SMDIST_AUTOTUNE_LOG": str(tmp_path / "autotune.csv")})
