"""A failing rank ends the job within seconds, with its own exit code and name; nothing stays in /dev/shm.

Real smdistrun and mpirun jobs whose ranks import TensorFlow (tests/mp/fault_ranks.py),
and lone processes that start the engine without a launcher.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from smdist_tf.run.session_dir import BASE_VARIABLE, private_session_base
from tests.mpi_harness import mpi_env, mpirun_path

ROOT = Path(__file__).resolve().parent.parent
FAULT_RANKS = str(ROOT / "tests" / "mp" / "fault_ranks.py")
SMDISTRUN = str(Path(sys.executable).parent / "smdistrun")
SHM = Path("/dev/shm")
# How long a job may live on after one rank fails (the bound).
FAILURE_TO_END_S = 5.0
# Timed (a job must end within FAILURE_TO_END_S) and judged by what is in /dev/shm: run with no background job.
pytestmark = pytest.mark.wall_clock


def run_job(np: int, mode: str, timeout: float = 120) -> tuple[int, str, float]:
    """Runs fault_ranks.py MODE under smdistrun; returns (exit code, output, seconds from the failure to the end)."""
    proc = subprocess.run([SMDISTRUN, "-np", str(np), sys.executable, FAULT_RANKS, mode, uuid.uuid4().hex],
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=timeout)
    ended = time.time()
    output = proc.stdout + proc.stderr
    failing = re.search(r"FAILING (\d+\.\d+)", output)
    assert failing, output[-5000:]
    return proc.returncode, output, ended - float(failing.group(1))


def test_rank_exiting_while_its_peer_computes_ends_the_job_fast():
    code, output, lived_on = run_job(2, "exit_while_peer_computes")
    assert code == 3, output[-5000:]
    assert re.search(r"smdistrun: rank 1 \(on \S+\) exited with code 3", output), output[-5000:]
    # Before: the exiting rank waited in MPI_Finalize for its peer's 60 s computation.
    assert lived_on < FAILURE_TO_END_S, f"the job lived {lived_on:.1f} s after rank 1 exited"


@pytest.mark.parametrize("attempt", [1, 2])
def test_first_failing_rank_is_named_with_its_code(attempt):
    code, output, lived_on = run_job(4, "exit_during_collectives")
    # The other ranks' collectives fail because rank 1 left: they exit with errors of
    # their own, which must not be taken for the cause.
    assert code == 3, output[-5000:]
    assert re.search(r"smdistrun: rank 1 \(on \S+\) exited with code 3", output), output[-5000:]
    assert lived_on < FAILURE_TO_END_S, f"the job lived {lived_on:.1f} s after rank 1 exited"
    for r in (0, 2, 3):
        assert "Traceback" not in "".join(line for line in output.splitlines(True) if line.startswith(f"[{r}]"))


def test_exception_on_one_rank_shows_its_traceback_once_and_ends_the_job():
    code, output, lived_on = run_job(2, "raise_on_rank0")
    assert code == 1, output[-5000:]
    assert re.search(r"smdistrun: rank 0 \(on \S+\) exited with code 1", output), output[-5000:]
    assert output.count("Traceback (most recent call last)") == 1, output[-5000:]
    assert "[0]<stderr>:RuntimeError: failure injected on rank 0" in output
    # The other rank's failure is only an echo: one line naming the cause, no traceback.
    assert re.search(r"\[1\]<stderr>:\[smdist_tf rank 1\] AbortedError at .*fault_ranks\.py:\d+: "
                     r"rank 0 is exiting with code 1; smdist_tf stopped on every rank", output), output[-5000:]
    assert lived_on < FAILURE_TO_END_S, f"the job lived {lived_on:.1f} s after the exception"


def segment_files() -> set[Path]:
    return {p for p in SHM.glob("*segment.*")}


LONE_PROCESS = textwrap.dedent("""
    import smdist_tf as sd, tensorflow as tf
    sd.init()
    assert float(sd.allreduce(tf.ones([1]))[0]) == 1.0
    print("DONE", flush=True)
""")


def test_lone_process_leaves_nothing_in_dev_shm():
    before = segment_files()
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", LONE_PROCESS], cwd=ROOT, env=mpi_env(), capture_output=True,
                              text=True, timeout=120)
        assert "DONE" in proc.stdout, proc.stderr[-3000:]
    assert segment_files() - before == set()


def test_segments_of_a_killed_job_are_swept_at_the_next_start(tmp_path):
    script = tmp_path / "hold.py"
    script.write_text("import time, smdist_tf as sd, tensorflow as tf\nsd.init()\nsd.allreduce(tf.ones([1 << 20]))\n"
                      "print('READY', flush=True)\ntime.sleep(300)\n")
    before = segment_files()
    with private_session_base(BASE_VARIABLE, mpi_env()) as session:  # mpirun is killed below
        job = subprocess.Popen([mpirun_path(), "-np", "2", "--oversubscribe", "--bind-to", "none", sys.executable,
                                str(script)], cwd=ROOT, env=session, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
        try:
            ready = 0
            deadline = time.monotonic() + 120
            while ready < 2 and time.monotonic() < deadline:
                line = job.stdout.readline()
                ready += line.startswith("READY")
            assert ready == 2
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the launcher too: nobody left to clean up
            job.wait(timeout=30)
    left = segment_files() - before
    assert len(left) == 2, f"expected the killed job's two segments, found {left}"

    # A segment-named file some live process still holds is never removed.
    held = SHM / f"sm_segment.test-holder.{os.getuid()}.{uuid.uuid4().hex[:8]}.0"
    held.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen(["sleep", "300"], stdin=open(held, "rb"))
    try:
        old = time.time() - 600  # older than the sweep's 60 s guard for jobs just starting elsewhere
        for path in left | {held}:
            os.utime(path, (old, old))
        proc = subprocess.run([sys.executable, "-c", LONE_PROCESS], cwd=ROOT, env=mpi_env(), capture_output=True,
                              text=True, timeout=120)
        assert "DONE" in proc.stdout, proc.stderr[-3000:]
        assert not any(path.exists() for path in left), "the killed job's segments were not swept"
        assert "left behind by a job that was killed" in proc.stderr
        assert held.exists(), "a segment still open in a live process was removed"
    finally:
        holder.kill()
        holder.wait()
        held.unlink(missing_ok=True)


def test_rank_agent_reports_an_echoed_failure_as_stopped():
    # A rank whose failure only echoes another's says so on stderr; its agent passes
    # that on as "stopped" and keeps the marker out of the output.
    from smdist_tf.run.rank_agent import ECHO_EVENT, MARKER

    token = "t" + uuid.uuid4().hex[:8]
    child = f"import os; os.write(2, b'{MARKER}{token} {ECHO_EVENT}\\n'); os.write(2, b'real error\\n'); raise SystemExit(1)"
    agent = str(ROOT / "smdist_tf" / "run" / "rank_agent.py")
    for echoed, program in [(True, child), (False, "raise SystemExit(1)")]:
        proc = subprocess.run([sys.executable, agent, "--", sys.executable, "-c", program],
                              env={**os.environ, "SMDISTRUN_TOKEN": token, "OMPI_COMM_WORLD_RANK": "2"},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1] == f"{MARKER}{token} exit 2 1 0 {int(echoed)}", proc.stderr
        assert ECHO_EVENT not in proc.stderr.replace(f"exit 2 1 0 {int(echoed)}", "")
        if echoed:
            assert "[2]<stderr>:real error" in proc.stderr
