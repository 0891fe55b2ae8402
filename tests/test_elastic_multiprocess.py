"""Restarts and elastic training with the real smdistrun, mpirun and TensorFlow.

* A rank SIGKILLed mid-training: ``--max-restarts 1`` starts the job again, training
  resumes from the last commit, and the final weights equal an uninterrupted run's bit
  for bit (examples/elastic_keras.py, with ``fit`` and with a custom loop).
* ``smdist_tf.run(max_restarts=1)``: rank 0's commit reaches a rank whose
  ``SMDIST_ELASTIC_DIR`` is another directory (hosts need not share it).
* When smdistrun restarts and when it does not (success, Ctrl-C, the limit), and a host
  discovery script driving -np: standard-library rank programs (tests/mp/restart_ranks.py)
  that start in well under a second.

Every job runs smdistrun as a process of its own with a timeout that kills its whole
process group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import smdist_tf
from tests.mpi_harness import ROOT, mpi_env

EXAMPLE = str(ROOT / "examples" / "elastic_keras.py")
RANKS = str(ROOT / "tests" / "mp" / "restart_ranks.py")


def smdistrun(args: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, str]:
    """Runs ``python -m smdist_tf.run ARGS``; returns (exit code, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "smdist_tf.run", *args], cwd=ROOT, env=mpi_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"smdistrun {' '.join(args)} ran longer than {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


def attempts(out: str) -> list[dict]:
    """The ATTEMPT reports of tests/mp/restart_ranks.py, in output order."""
    return [json.loads(m) for m in re.findall(r"^\[\d+\]<stdout>:ATTEMPT (.*)$", out, re.M)]


def leftovers(tag: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


# ---------------------------------------------------------------- training survives a killed rank

@pytest.mark.optional_packages  # the example loads scikit-learn's digits
@pytest.mark.parametrize("loop", ["fit", "tape"])
def test_killed_rank_restarts_and_training_ends_bit_identical(loop, tmp_path):
    common = [EXAMPLE, "--loop", loop, "--epochs", "2", "--batches-per-commit", "2"]
    start = time.monotonic()
    code, out, err = smdistrun(["-np", "2", sys.executable, *common, "--weights-out", str(tmp_path / "a.npz")], 120)
    assert code == 0, out[-3000:] + err[-3000:]
    uninterrupted_s = time.monotonic() - start

    code, out, err = smdistrun(["-np", "2", "--max-restarts", "1", sys.executable, *common, "--kill-at", "1:3",
                                "--weights-out", str(tmp_path / "b.npz")], 120)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "[1]<stdout>:rank 1: killing myself after batch 3 of epoch 1" in out
    assert re.search(r"^smdistrun: restart 1 of 1 in 1 s: rank 1 \(on \S+\) was killed by SIGKILL \(exit code 137\)$",
                     err, re.M), err[-3000:]
    assert len(re.findall(r"^smdistrun: restart ", err, re.M)) == 1
    # Resumed from the commit after batch 2 of epoch 1 (every 2 batches), not from the start.
    assert "[0]<stdout>:attempt 0: starting at epoch 0, batch 0" in out
    assert "[0]<stdout>:attempt 1: starting at epoch 1, batch 2" in out, out[-3000:]
    assert "elastic: resumed from commit" in err

    uninterrupted, restarted = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert len(uninterrupted.files) == 14  # 4 model variables; iterations, learning rate and 8 Adam slots
    for name in uninterrupted.files:
        assert np.array_equal(uninterrupted[name], restarted[name]), name
    print(f"{loop}: uninterrupted {uninterrupted_s:.1f} s, with a restart {time.monotonic() - start - uninterrupted_s:.1f} s")


def test_programmatic_run_restarts_and_rank_0s_commit_reaches_every_rank(tmp_path):
    from tests.mp import restart_ranks as fns

    unshared = tmp_path / "rank1-sees-this-dir"
    results = smdist_tf.run(fns.resume_with_unshared_dir, args=(str(unshared),), np=2, max_restarts=1,
                            env={"TF_CPP_MIN_LOG_LEVEL": "2"}, start_timeout=60)
    # The second attempt started from commit 2 (step 2, two sums of [1, 0] + [1, 1]) on both ranks.
    assert results == [((2, [4.0, 2.0]), 4, [8.0, 4.0])] * 2
    assert not unshared.exists()  # rank 1 never touched its own directory


# ---------------------------------------------------------------- when smdistrun restarts

def test_restart_after_failure_has_a_new_token_and_the_same_elastic_dir():
    code, out, err = smdistrun(["-np", "2", "--max-restarts", "2", sys.executable, RANKS, "fail_first"], 60)
    assert code == 0, err
    seen = attempts(out)
    assert sorted((a["restart"], a["rank"]) for a in seen if a["restart"] == 1) == [(1, 0), (1, 1)]
    assert {a["restart"] for a in seen} == {0, 1}
    assert len({a["token"] for a in seen if a["restart"] == 0} | {a["token"] for a in seen if a["restart"] == 1}) == 2
    (elastic_dir,) = {a["elastic_dir"] for a in seen}
    assert elastic_dir and not os.path.exists(elastic_dir)  # made for the launch, removed at its end
    assert re.search(r"^smdistrun: restart 1 of 2 in 1 s: rank 1 \(on \S+\) exited with code 3$", err, re.M), err


def test_no_restart_when_every_rank_succeeds(tmp_path):
    kept = tmp_path / "commits"
    code, out, err = smdistrun(["-np", "2", "--max-restarts", "2", "--elastic-dir", str(kept),
                                sys.executable, RANKS, "succeed"], 60)
    assert code == 0 and "restart" not in err, err
    assert sorted((a["rank"], a["restart"], a["elastic_dir"]) for a in attempts(out)) == [
        (0, 0, str(kept)), (1, 0, str(kept))]


def test_restarts_stop_after_the_limit_with_the_last_attempts_code():
    start = time.monotonic()
    code, out, err = smdistrun(["-np", "2", "--max-restarts", "2", sys.executable, RANKS, "always_fail"], 60)
    assert code == 12, err  # 10 + the restart count of the last attempt
    assert re.findall(r"^smdistrun: restart (\d) of 2 in (\d) s: rank 1 .* exited with code (\d+)$", err, re.M) == [
        ("1", "1", "10"), ("2", "2", "11")]
    assert "not restarting: all 2 restarts (--max-restarts) are used" in err
    assert time.monotonic() - start >= 3  # the backoff: 1 s, then 2 s


def test_without_max_restarts_a_failure_ends_the_job():
    code, out, err = smdistrun(["-np", "2", sys.executable, RANKS, "fail_first"], 60)
    assert code == 3 and "restart" not in err, err
    assert {a["restart"] for a in attempts(out)} == {0} and {a["elastic_dir"] for a in attempts(out)} == {None}


def _interrupt_when(proc: subprocess.Popen, pattern: str, stream_name: str, timeout: float) -> str:
    """Reads the stream until a line matches, then sends SIGINT (Ctrl-C) to smdistrun; returns what was read."""
    stream = getattr(proc, stream_name)
    seen = ""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        line = stream.readline()
        if not line:
            break
        seen += line
        if re.search(pattern, seen, re.M):
            proc.send_signal(signal.SIGINT)
            return seen
    pytest.fail(f"never saw {pattern!r}:\n{seen[-3000:]}")


@pytest.mark.parametrize("when", ["while-running", "during-backoff"])
def test_ctrl_c_is_never_restarted(when):
    tag = uuid.uuid4().hex
    mode, pattern, stream = (("hang", r"ready 0[\s\S]*ready 1|ready 1[\s\S]*ready 0", "stdout") if when == "while-running"
                             else ("always_fail", r"^smdistrun: restart 1 of 5 in 1 s", "stderr"))
    proc = subprocess.Popen([sys.executable, "-m", "smdist_tf.run", "-np", "2", "--max-restarts", "5",
                             sys.executable, RANKS, mode, tag], cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _interrupt_when(proc, pattern, stream, 30)
        code = proc.wait(timeout=30)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 128 + signal.SIGINT, err
    if when == "while-running":
        assert "received SIGINT, stopping all ranks" in err and "restart" not in err, err
    else:
        assert "received SIGINT, not starting the job again" in err and "restart 2 of" not in err, err
    time.sleep(0.5)
    assert leftovers(tag) == []


# ---------------------------------------------------------------- host discovery

def _discovery_script(tmp_path: Path, answers: list[str]) -> str:
    """An executable that prints answers[i] on its i-th run (the last one from then on)."""
    script = tmp_path / "discover.py"
    calls = tmp_path / "calls"
    script.write_text(f"#!{sys.executable}\n"
                      "import pathlib\n"
                      f"calls = pathlib.Path({str(calls)!r})\n"
                      "n = int(calls.read_text()) if calls.exists() else 0\n"
                      "calls.write_text(str(n + 1))\n"
                      f"answers = {answers!r}\n"
                      "print(answers[min(n, len(answers) - 1)])\n")
    script.chmod(0o755)
    return str(script)


def test_discovery_script_drives_np_at_each_start(tmp_path):
    script = _discovery_script(tmp_path, ["localhost:2", "localhost:4"])
    code, out, err = smdistrun(["--min-np", "2", "--max-np", "3", "--host-discovery-script", script,
                                sys.executable, RANKS, "fail_first"], 60)
    assert code == 0, err
    sizes = {(a["restart"], a["size"]) for a in attempts(out)}
    assert sizes == {(0, 2), (1, 3)}, out  # 2 slots, then 4 slots capped by --max-np 3
    assert "restart 1 of 3" in err  # a discovery script without --max-restarts allows 3
    assert "host discovery changed the job: localhost:4 -> 3 ranks" in err


def test_discovery_waits_for_min_np_slots(tmp_path):
    script = _discovery_script(tmp_path, ["localhost:1", "localhost:1", "localhost:2"])
    code, out, err = smdistrun(["--min-np", "2", "--host-discovery-script", script, sys.executable, RANKS, "succeed"], 60)
    assert code == 0, err
    assert "waiting up to 600 s for 2 slots (host discovery found localhost:1)" in err
    assert sorted(a["size"] for a in attempts(out)) == [2, 2]
    assert (tmp_path / "calls").read_text() == "3"


@pytest.mark.wall_clock
def test_discovery_gives_up_after_the_elastic_timeout(tmp_path):
    script = _discovery_script(tmp_path, ["localhost:1"])
    start = time.monotonic()
    code, out, err = smdistrun(["-np", "2", "--elastic-timeout", "2", "--host-discovery-script", script,
                                sys.executable, RANKS, "succeed"], 60)
    assert code == 1 and attempts(out) == [], err
    assert ("host discovery found 1 slot (localhost:1), fewer than --min-np 2, for 2 s (--elastic-timeout)"
            in err), err
    assert 2 <= time.monotonic() - start < 20
