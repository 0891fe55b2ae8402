"""Smoke tests of the benchmarks: short runs emit well-formed JSON (benchmarks/allreduce.py: for every system).

It checks the output's shape only, never performance: the machine may be loaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "allreduce.py"
RESULT_KEYS = {"system", "case", "size_bytes", "dtype", "np", "seconds", "algbw", "busbw", "iters"}
SUMMARY_KEYS = {
    "busbw_ratio_smdist_vs_mpi_fp32", "latency_4KiB_eager_us", "fused_speedup_vs_unfused",
    "fp16_compression_time_ratio_vs_fp32", "int8_compression_time_ratio_vs_fp32", "memcpy_GBps", "load_average", "systems_present", "errors",
    "fused_speedup_vs_unfused_small_tensors", "fused_speedup_vs_unfused_many_small",
    "many_small_fused_speedup_vs_mpi_loop", "adasum_time_ratio_vs_sum_fp32",
}


def _run_quick(np_: int, timeout: float, *extra: str) -> tuple[int, str, str]:
    """Runs the driver; kills its whole process group (mpirun and ranks) on timeout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("OMPI_COMM_WORLD_SIZE", None)  # the driver refuses to run under mpirun
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--np", str(np_), "--quick", "--timeout", "240", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"benchmark timed out after {timeout} s\n{err[-5000:]}")
    return proc.returncode, out, err


def test_quick_run_emits_json_for_all_systems() -> None:
    code, out, err = _run_quick(2, timeout=300)
    assert code == 0, f"exit {code}\nstdout:\n{out[-5000:]}\nstderr:\n{err[-5000:]}"
    lines = [line for line in out.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every stdout line must be JSON
    assert all(isinstance(r, dict) for r in records)
    summary = records[-1]
    assert summary.get("summary") is True
    assert SUMMARY_KEYS <= summary.keys(), SUMMARY_KEYS - summary.keys()
    assert summary["np"] == 2 and summary["errors"] == []

    results = [r for r in records[:-1] if r.get("case") != "engine_config"]
    for r in results:
        assert RESULT_KEYS <= r.keys(), (RESULT_KEYS - r.keys(), r)
        assert r["np"] == 2
        assert r["seconds"] is None or r["seconds"] > 0
    systems = {r["system"] for r in results}
    assert {"smdist_tf", "smdist_tf_graph", "mpi", "mwms", "memcpy"} <= systems, systems
    cases = {(r["system"], r["case"]) for r in results}
    for needed in [("smdist_tf", "single"), ("smdist_tf", "fp16_compression"), ("smdist_tf", "int8_compression"),
                   ("smdist_tf", "resnet50_grads_fused"),
                   ("smdist_tf", "resnet50_grads_unfused"), ("smdist_tf", "resnet50_small_grads_fused"),
                   ("smdist_tf", "many_small_fused"), ("smdist_tf", "many_small_unfused"), ("mpi", "many_small_loop"),
                   ("mpi", "single"), ("mwms", "single"), ("smdist_tf", "adasum")]:
        assert needed in cases, needed
    dtypes = {r["dtype"] for r in results if r["system"] == "smdist_tf" and r["case"] == "single"}
    assert dtypes == {"float32", "float16", "bfloat16"}
    # The quick sizes include 4 KiB and 1 MiB, so the summary's ratios are all computed.
    assert summary["latency_4KiB_eager_us"] is not None
    assert summary["fused_speedup_vs_unfused"] is not None
    assert summary["fused_speedup_vs_unfused_many_small"] is not None
    assert summary["many_small_fused_speedup_vs_mpi_loop"] is not None
    assert summary["busbw_ratio_smdist_vs_mpi_fp32"].get(str(1 << 20)) is not None


def test_two_hosts_run_crosses_the_veth() -> None:
    """--two-hosts: one rank per namespace host, so smdist_tf reduces over MPI between hosts."""
    code, out, err = _run_quick(2, 300, "--two-hosts", "--systems", "smdist_tf,mpi", "--dtypes", "float32")
    if code != 0 and "--two-hosts:" in err:
        pytest.skip(err.strip().splitlines()[-1])  # no root / namespaces on this machine
    assert code == 0, f"exit {code}\nstdout:\n{out[-5000:]}\nstderr:\n{err[-5000:]}"
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    summary = records[-1]
    assert summary["two_hosts"] is True and summary["errors"] == []
    config = next(r for r in records if r.get("case") == "engine_config")["config"]
    assert config["intra_host_allreduce"] == "mpi"  # no local peer: every byte crossed the veth
    assert summary["fp16_compression_time_ratio_vs_fp32"].get(str(1 << 20)) is not None
    assert summary["int8_compression_time_ratio_vs_fp32"].get(str(1 << 20)) is not None



def test_repeats_are_summarised_by_their_median() -> None:
    """--repeat N: each figure is the median over the runs that measured it; targets follow the medians."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import allreduce as bench

    args = bench.parse_args(["--np", "2", "--sizes", "4K,1M,16M", "--repeat", "3"])

    def run(mpi_s: float, smdist_s: float, fused_s: Optional[float]) -> list[dict]:
        recs = []
        for size in (4096, 1 << 20, 16 << 20):
            recs.append(bench.record("mpi", "single", size, "float32", 2, mpi_s * size / 4096, 10))
            recs.append(bench.record("smdist_tf", "single", size, "float32", 2, smdist_s * size / 4096, 10))
        if fused_s is not None:
            recs.append(bench.record("smdist_tf", "resnet50_grads_fused", 1 << 20, "float32", 2, fused_s, 10))
            recs.append(bench.record("smdist_tf", "resnet50_grads_unfused", 1 << 20, "float32", 2, 1.0, 10))
        return recs

    runs = [run(1e-4, 2e-4, 0.5), run(1e-4, 0.5e-4, None), run(1e-4, 0.8e-4, 0.2)]
    figures = [bench.measure_ratios(r, args) for r in runs]
    assert [f["busbw_ratio_smdist_vs_mpi_fp32"][str(1 << 20)] for f in figures] == [0.5, 2.0, 1.25]
    combined = bench.median_of_repeats(figures)
    assert combined["busbw_ratio_smdist_vs_mpi_fp32"] == {str(1 << 20): 1.25, str(16 << 20): 1.25}
    assert combined["latency_4KiB_eager_us"] == 80.0
    assert combined["fused_speedup_vs_unfused"] == 3.5  # median of the two runs that measured it
    assert combined["fp16_compression_time_ratio_vs_fp32"] == {str(1 << 20): None, str(16 << 20): None}
    summary = bench.summarize(combined, [r for run_ in runs for r in run_], args, [], {})
    assert summary["repeats"] == 3
    assert summary["target_busbw_ge_1x_mpi"] is True and summary["target_busbw_ge_2x_mpi_ge_16MiB"] is False
    assert summary["target_latency_4KiB_le_100us"] is True and summary["target_fused_ge_3x"] is True
    assert summary["target_fp16_compression_faster_ge_1MiB"] is None


def test_like_for_like_target_pairs_eager_with_out_of_place_and_graph_with_in_place() -> None:
    """The like-for-like figure: eager against MPI out of place, tf.function against MPI in place."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import allreduce as bench

    args = bench.parse_args(["--np", "2", "--sizes", "1M"])
    size = 1 << 20

    def summary(graph_s: float) -> dict:
        recs = [bench.record("mpi", "single", size, "float32", 2, 1.0, 10),
                bench.record("mpi", "single_out_of_place", size, "float32", 2, 1.5, 10),
                bench.record("smdist_tf", "single", size, "float32", 2, 1.25, 10),  # 0.8x MPI in place
                bench.record("smdist_tf_graph", "single", size, "float32", 2, graph_s, 10)]
        return bench.summarize(bench.measure_ratios(recs, args), recs, args, [], {})

    ok = summary(graph_s=0.8)  # eager 1.2x MPI out of place, graph 1.25x MPI in place
    assert ok["target_busbw_ge_1x_mpi"] is False
    assert ok["min_busbw_ratio_ge_1MiB_like_for_like"] == 1.2 and ok["target_busbw_ge_1x_mpi_like_for_like"] is True
    slow_graph = summary(graph_s=1.25)
    assert slow_graph["min_busbw_ratio_ge_1MiB_like_for_like"] == 0.8
    assert slow_graph["target_busbw_ge_1x_mpi_like_for_like"] is False


def test_copy_alias_emits_json_for_every_copy() -> None:
    """benchmarks/copy_alias.py: one process, no MPI; checks its copies and prints one line per case."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "copy_alias.py"), "--repeat", "3"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-5000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert {r["copy"] for r in records} == {"memcpy", "copy_bytes", "copy_bytes_vector_loop", "process_vm_readv"}
    assert len(records) == 4 * 3 * 5  # copies x sizes x deltas
    assert all(r["seconds"] > 0 for r in records)


def run_on_two_ranks(script: str, args: list, timeout: float) -> list:
    """Runs ``benchmarks/<script>`` with smdistrun on 2 ranks; returns rank 0's JSON lines."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    smdistrun = str(Path(sys.executable).parent / "smdistrun")
    result = subprocess.run([smdistrun, "-np", "2", sys.executable, str(ROOT / "benchmarks" / script), *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-5000:]
    return [json.loads(line.split(":", 1)[1]) for line in result.stdout.splitlines() if line.startswith("[0]<stdout>:{")]


def test_soak_short_run_samples_and_summarises() -> None:
    """benchmarks/soak.py for a few seconds on 2 ranks: checks its results as it goes, prints samples and a summary."""
    records = run_on_two_ranks("soak.py", ["--minutes", "0.15", "--sample-seconds", "3", "--warmup-minutes", "0.05"],
                               timeout=180)
    samples = [r for r in records if r["kind"] == "sample"]
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert len(samples) >= 3 and samples[-1]["calls"] > 0
    assert {"rss_mib", "fds", "threads", "shm_files", "shm_mib"} <= set(samples[0])
    assert summary["np"] == 2 and summary["calls"] > 0
    assert {"rss_mib_growth", "rss_mib_growth_second_half", "fds_growth", "shm_files_growth"} <= set(summary)


def run_scaling_quick(extra: list, timeout: float) -> tuple[list, str, str]:
    """Runs ``benchmarks/scaling.py --quick`` with ``extra`` arguments; returns its JSON lines, stdout and stderr."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("OMPI_COMM_WORLD_SIZE", None)
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--quick", "--timeout", "240",
                             *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"scaling benchmark timed out\n{out[-5000:]}\n{err[-5000:]}")
    return [json.loads(line) for line in out.splitlines() if line.strip()], out, err  # every stdout line is JSON


def test_scaling_quick_run_measures_ceiling_and_every_smdist_path() -> None:
    """benchmarks/scaling.py --quick: the ceiling and the three smdist_tf paths each give a line, and a summary.

    Shape only, never performance: the ratios are reported, not judged.
    """
    records, out, err = run_scaling_quick([], timeout=300)
    summary = records[-1]
    assert summary.get("summary") is True, out[-5000:]
    measured = {r["system"]: r for r in records[:-1] if "samples_per_sec" in r}
    smdist_paths = ["smdist_tape", "smdist_fit_optimizer", "smdist_fit_strategy"]
    for system in ["ceiling", *smdist_paths]:
        assert system in measured, (system, out[-5000:], err[-3000:])
        r = measured[system]
        assert r["model"] == "mlp" and r["np"] == 2 and r["repeat"] == 0
        assert r["samples_per_sec"] > 0 and r["step_ms"] > 0
    case = summary["results"]["mlp@np2"]
    for system in smdist_paths:
        assert measured[system]["ratio_to_ceiling"] > 0
        assert case["median_ratio_to_ceiling"][system] > 0
    tape = measured["smdist_tape"]
    assert tape["grad_bytes"] > 0 and tape["wire_ms"] > 0 and tape["compute_ms"] > 0 and "overhead_ms" in tape
    assert summary["every_smdist_path_ge_0.90_of_ceiling_at_np2"] in (True, False)
    # Peers appear as a measurement, an error line or a skip note; none of it fails the test.
    for peer in ["horovod_tape", "mwms"]:
        assert any(r.get("system") == peer for r in records[:-1]), peer


def test_scaling_quick_run_with_xla_and_autotune_variants() -> None:
    """``--xla --autotune``: each variant of the tape path gives a line, and the summary compares them.

    Shape only: the autotuned job must have tuned (it reports the choice), the ratios are not judged.
    """
    records, out, err = run_scaling_quick(["--xla", "--autotune", "--systems", "ceiling", "smdist_tape"], timeout=400)
    summary = records[-1]
    assert summary.get("summary") is True and not summary["errors"], out[-5000:]
    measured = {r["label"]: r for r in records[:-1] if "samples_per_sec" in r}
    assert set(measured) == {"ceiling", "ceiling[xla]", "smdist_tape", "smdist_tape[autotune]", "smdist_tape[xla]",
                             "smdist_tape[xla][autotune]"}, (sorted(measured), err[-3000:])
    assert measured["smdist_tape[autotune]"]["autotuned"]["fusion_threshold_bytes"] > 0
    assert measured["smdist_tape"]["autotuned"] is None
    case = summary["results"]["mlp@np2"]
    assert set(case["xla_over_graph"]) == {"ceiling", "smdist_tape"}
    assert set(case["autotune_over_default"]) == {"smdist_tape", "smdist_tape[xla]"}


def test_pipeline_benchmark_compares_every_configuration_with_one_process() -> None:
    records = run_on_two_ranks("pipeline.py", ["--microbatches", "1", "2", "--schedules", "1f1b", "--width", "16",
                                               "--depth", "2", "--batch-size", "32", "--steps", "2", "--repeats", "2"],
                               timeout=180)
    rows = [r for r in records if "schedule" in r]
    assert [r["microbatches"] for r in rows] == [1, 2]
    for r in rows:
        assert r["single_process_seconds"] > 0 and r["step_seconds"] > 0
        assert r["over_single_process"] == pytest.approx(r["step_seconds"] / r["single_process_seconds"], rel=0.01)
        assert r["peak_microbatches"] == [min(r["microbatches"], 2), 1]
    (summary,) = [r for r in records if "summary" in r]
    assert set(summary["over_single_process"]) == {"1", "2"} and summary["most_over_fewest_microbatches"] > 0


def test_step_overhead_benchmark_reports_every_system_and_mode() -> None:
    records = run_on_two_ranks("step_overhead.py", ["--tensors", "2", "6", "--steps", "2", "--warmup", "1",
                                                    "--repeats", "1"], timeout=180)
    cases = {(r["system"], r["mode"], r["tensors"]) for r in records if "system" in r}
    systems = ("plain", "tape", "optimizer", "strategy", "allreduce")
    assert cases == {(s, m, n) for s in systems for m in ("eager", "function") for n in (2, 6)}
    summaries = [r for r in records if "summary" in r]
    assert {(r["summary"], r["mode"]) for r in summaries} == {(s, m) for s in systems[1:] for m in ("eager", "function")}
    assert all(r["ranks"] == 2 and isinstance(r["extra_us_per_tensor"], float) for r in summaries)
