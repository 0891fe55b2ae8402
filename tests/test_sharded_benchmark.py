"""Smoke test of benchmarks/sharded.py: a --quick run emits a JSON line per job and a summary line.

It checks the output's shape only, never performance: the machine may be loaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "sharded.py"
JOB_KEYS = {"mode", "np", "repeat", "params", "optimizer", "sharded", "state_bytes", "shard_copy_bytes",
            "peak_rss_bytes", "peak_rss_before_fit_bytes", "rss_before_fit_bytes", "rss_end_bytes",
            "rss_end_after_malloc_trim_bytes", "pool_between_steps_bytes", "pool_step_peak_bytes", "step_s",
            "step_s_min", "peak_rss_growth_in_fit_bytes", "per_rank_peak_rss_bytes", "per_rank_state_bytes"}
SUMMARY_KEYS = {"np", "repeats", "state_bytes_ratio", "state_bytes_ratio_target", "step_time_ratio",
                "step_time_ratio_target", "rss_saved_bytes", "state_saved_bytes", "rss_saved_fraction_of_state_saved",
                "target_state_bytes_met", "target_step_time_met", "target_rss_met", "errors"}


def test_quick_run_emits_a_line_per_job_and_a_summary() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("OMPI_COMM_WORLD_SIZE", None)  # the driver refuses to run under mpirun
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--quick", "--timeout", "90"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=110)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpirun and its ranks too
        out, err = proc.communicate()
        raise AssertionError(f"sharded benchmark timed out\n{out[-5000:]}\n{err[-5000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out[-5000:]}\nstderr:\n{err[-5000:]}"
    records = [json.loads(line) for line in out.splitlines() if line.strip()]  # every stdout line is JSON
    *jobs, summary = records
    assert [(j["mode"], j["repeat"]) for j in jobs] == [("unsharded", 0), ("sharded", 0)]
    for job in jobs:
        assert JOB_KEYS <= job.keys(), JOB_KEYS - job.keys()
        assert job["np"] == 2 and job["optimizer"] == "Adam" and job["sharded"] == (job["mode"] == "sharded")
        assert len(job["per_rank_peak_rss_bytes"]) == 2 and job["step_s"] > 0 and job["peak_rss_bytes"] > 0
    assert summary.get("summary") is True
    assert SUMMARY_KEYS <= summary.keys(), SUMMARY_KEYS - summary.keys()
    assert summary["np"] == 2 and summary["repeats"] == 1 and summary["errors"] == []
    assert summary["state_bytes_ratio_target"] == 0.55
    for key in ("target_state_bytes_met", "target_step_time_met", "target_rss_met"):
        assert summary[key] in (True, False), key


def test_summary_takes_medians_over_repeats() -> None:
    """The targets are judged on each mode's median over repeats."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import sharded as bench

    args = bench.parse_args(["--np", "4", "--repeat", "3"])

    def line(mode: str, step_s: float, rss: int) -> dict:
        state = 800 if mode == "unsharded" else 200
        return {"mode": mode, "np": 4, "state_bytes": state, "peak_rss_bytes": rss, "step_s": step_s,
                "peak_rss_growth_in_fit_bytes": rss - 100}

    lines = [line("unsharded", s, r) for s, r in ((1.0, 2000), (2.0, 2100), (9.0, 1900))]
    lines += [line("sharded", s, r) for s, r in ((1.0, 1800), (1.5, 1700), (1.2, 1750))]
    summary = bench.summarize(4, lines, ["np=4 sharded repeat=3: exit 1: boom", "np=2 x"], args)
    assert summary["state_bytes_ratio"] == 0.25 and summary["state_bytes_ratio_target"] == 0.3
    assert summary["step_time_ratio"] == 0.6  # 1.2 / 2.0
    assert summary["rss_saved_bytes"] == 250 and summary["state_saved_bytes"] == 600
    assert summary["rss_saved_fraction_of_state_saved"] == round(250 / 600, 4)
    assert summary["target_state_bytes_met"] and summary["target_step_time_met"] and summary["target_rss_met"]
    assert summary["errors"] == ["np=4 sharded repeat=3: exit 1: boom"]


def test_stage3_summary_judges_the_pool_peak_against_the_goal() -> None:
    """Stage 3's goals: its pool peak against (stage 0's weights + gradient + state) / N + the largest layer."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import sharded as bench

    args = bench.parse_args(["--np", "2", "--stage", "3", "--repeat", "1"])
    share = {"unsharded": 1000, "stage1": 1000, "stage2": 1000, "sharded": 500, "stage3_overlap": 500}
    peaks = {"unsharded": 5000, "stage1": 4000, "stage2": 3500, "sharded": 2300, "stage3_overlap": 3100}
    steps = {"unsharded": 1.0, "stage1": 0.9, "stage2": 0.9, "sharded": 1.2, "stage3_overlap": 1.0}
    lines = [{"mode": mode, "np": 2, "param_bytes": share[mode], "state_bytes": 2 * share[mode],
              "largest_layer_bytes": 400, "peak_rss_bytes": 9000, "peak_rss_growth_in_fit_bytes": 900,
              "pool_between_steps_bytes": 3 * share[mode], "pool_step_peak_bytes": peaks[mode], "step_s": steps[mode]}
             for mode in bench.STAGE3_MODES]
    summary = bench.summarize_stage3(2, lines, [], args)
    assert summary["model_bytes_goal"] == 4000 / 2 + 400  # (weights, a gradient, 2 slots) / N + a layer
    assert summary["pool_step_peak_bytes"]["sharded"] == 2300 and summary["target_pool_step_peak_met"]
    assert summary["overlap_backward_speedup"] == 1.2 and summary["target_step_time_met"]
    lines[3]["pool_step_peak_bytes"] = 2401
    assert not bench.summarize_stage3(2, lines, [], args)["target_pool_step_peak_met"]
