"""smdistrun with real mpirun: output tagging, flag delivery (to the engine too), TensorFlow's start-up
lines from rank 0 only, failures, signals, smdist_tf.run, bad arguments, and two hosts made of Linux
network namespaces.

Launcher mechanics run tiny standard-library rank programs (tests/mp/launcher_ranks.py)
so each job starts in well under a second; only the programmatic-allreduce, engine-flag,
TensorFlow start-up and two-host tests import TensorFlow on the ranks. Most jobs run main() in this process; the SIGTERM test
runs the real console script.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import smdist_tf
from benchmarks.netns_hosts import Unavailable, two_namespace_hosts
from smdist_tf.run import RunError
from smdist_tf.run.launcher import main

ROOT = Path(__file__).resolve().parent.parent
RANKS = str(ROOT / "tests" / "mp" / "launcher_ranks.py")
VENV_BIN = Path(sys.executable).parent



@pytest.fixture(autouse=True)
def quiet_tf(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def leftovers(tag: str) -> list[str]:
    """Processes whose command line carries the tag (there must be none after a job)."""
    out = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def ranks(mode: str, tag: str) -> list[str]:
    return [sys.executable, RANKS, mode, tag]


@pytest.mark.parametrize("np", [2, 4])
def test_output_is_tagged_and_flags_reach_every_rank(np, tmp_path, capfd, deadline):
    deadline(60)
    tag = uuid.uuid4().hex
    logs = tmp_path / "logs"
    code = main(["-np", str(np), "--output-filename", str(logs), "--fusion-threshold-mb", "2",
                 "--cycle-time-ms", "3.5", "--cache-capacity", "7", "--hierarchical-allreduce",
                 "--timeline-filename", "tl.json", "--log-level", "debug", *ranks("echo", tag)])
    out, err = capfd.readouterr()
    assert code == 0, err
    for r in range(np):
        assert f"[{r}]<stdout>:hello {r} {tag}\n" in out and f"[{r}]<stdout>:second {r}\n" in out
        assert f"[{r}]<stderr>:problem {r}\n" in err
        env = json.loads(re.search(rf"^\[{r}\]<stdout>:ENV (.*)$", out, re.M).group(1))
        assert env == {
            "SMDIST_FUSION_THRESHOLD": "2097152", "HOROVOD_FUSION_THRESHOLD": "2097152",
            "SMDIST_CYCLE_TIME": "3.5", "HOROVOD_CYCLE_TIME": "3.5",
            "SMDIST_CACHE_CAPACITY": "7", "HOROVOD_CACHE_CAPACITY": "7",
            "SMDIST_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
            "SMDIST_TIMELINE": "tl.json", "HOROVOD_TIMELINE": "tl.json",
            "SMDIST_LOG_LEVEL": "DEBUG", "HOROVOD_LOG_LEVEL": "DEBUG",
        }
        # --output-filename: untagged copies per rank.
        assert (logs / f"rank.{r}" / "stdout").read_text().startswith(f"hello {r} {tag}\nsecond {r}\n")
        assert (logs / f"rank.{r}" / "stderr").read_text() == f"problem {r}\n"
    assert "@smdistrun@" not in out + err  # the agents' markers are consumed


@pytest.mark.wall_clock
@pytest.mark.parametrize("np", [2, 4])
def test_failed_rank_stops_the_others_with_its_code(np, capfd, deadline):
    deadline(60)
    tag = uuid.uuid4().hex
    start = time.monotonic()
    code = main(["-np", str(np), *ranks("fail_one", tag)])
    elapsed = time.monotonic() - start
    _, err = capfd.readouterr()
    failed = min(2, np - 1)
    assert code == 7, err
    assert f"smdistrun: rank {failed} (on " in err and "exited with code 7; the other ranks were stopped" in err
    assert elapsed < 20, f"the other ranks were not stopped promptly ({elapsed:.1f} s)"
    time.sleep(0.5)
    assert leftovers(tag) == []


def test_what_a_stopped_rank_printed_reaches_the_user(tmp_path, monkeypatch, capfd, deadline):
    """Rank 0 prints its attempt line after rank 1 failed, while the job is being stopped (#40 item 10).

    mpirun stops relaying a job's output once a rank's exit aborts the job; rank agents of failed
    ranks wait for smdistrun to stop the job, so the others' lines are relayed until then.
    """
    deadline(60)
    monkeypatch.setenv("LATE_LINE_DIR", str(tmp_path))
    code = main(["-np", "2", "--max-restarts", "1", *ranks("late_line", uuid.uuid4().hex)])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "smdistrun: restart 1 of 1 in 1 s: rank 1 (on " in err, err
    for line in ("[0]<stdout>:attempt 0 on rank 0", "[0]<stdout>:attempt 1 on rank 0",
                 "[1]<stdout>:attempt 1 on rank 1"):
        assert line + "\n" in out, out


def test_a_killed_jobs_session_files_do_not_stop_the_next_job(tmp_path, monkeypatch, capfd, deadline):
    """A killed mpirun leaves $TMPDIR/ompi.<pid>/pmix.<host>.tool behind; with pids reused, plain
    mpirun then dies at start ("The PMIx server's listener thread failed to start")."""
    deadline(60)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    host = os.uname().nodename
    for offset in range(1, 2000):  # every pid the launcher's mpirun may be given next
        pid = (os.getpid() + offset) % pid_max
        (tmp_path / f"ompi.{pid}").mkdir(exist_ok=True)
        (tmp_path / f"ompi.{pid}" / f"pmix.{host}.tool").touch()
    stale = set(tmp_path.iterdir())
    tag = uuid.uuid4().hex
    code = main(["-np", "2", *ranks("echo", tag)])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    assert f"hello 1 {tag}" in out
    assert set(tmp_path.iterdir()) == stale, "the job's own session directory was not removed"


def test_log_level_and_cycle_marks_reach_the_engine(tmp_path, capfd, deadline):
    deadline(120)
    code = main(["-np", "2", "--log-level", "info", "--timeline-filename", str(tmp_path / "tl.json"),
                 "--timeline-mark-cycles", *ranks("engine_flags", uuid.uuid4().hex)])
    _, err = capfd.readouterr()
    assert code == 0, err
    for r in range(2):
        assert f"[{r}]<stderr>:[smdist_tf rank {r}] INFO: engine started: rank {r} of 2 on host " in err, err
        events = json.loads((tmp_path / f"tl.json.{r}").read_text())
        marks = [e for e in events if e.get("name") == "CYCLE_START"]
        assert marks and all(e["pid"] == r for e in marks), events


TF_STARTUP = re.compile(r"^\[(\d)\]<stderr>:(WARNING: All log messages before absl::InitializeLog|"
                        r"[IWE]\d{4} .*\] (oneDNN custom operations|This TensorFlow binary is optimized)|"
                        r"To enable the following instructions)", re.M)


def test_tensorflow_start_up_lines_come_from_rank_zero_unless_verbose(monkeypatch, capfd, deadline):
    deadline(120)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # the most start-up lines TensorFlow prints
    by_rank = {}
    for flags in ([], ["--verbose"]):
        code = main(["-np", "2", *flags, *ranks("tf_startup", uuid.uuid4().hex)])
        _, err = capfd.readouterr()
        assert code == 0, err
        assert "[0]<stderr>:imported 0\n" in err and "[1]<stderr>:imported 1\n" in err  # other lines pass
        lines = TF_STARTUP.findall(err)
        by_rank[bool(flags)] = [sum(rank == str(r) for rank, *_ in lines) for r in range(2)]
    quiet, verbose = by_rank[False], by_rank[True]
    assert quiet[0] > 0 and quiet[1] == 0, quiet
    assert verbose[0] == verbose[1] == quiet[0], verbose


@pytest.mark.optional_packages  # the example loads scikit-learn's digits
def test_an_example_prints_no_tensorflow_log_lines_by_default(monkeypatch, capfd, deadline):
    deadline(300)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    code = main(["-np", "2", sys.executable, str(ROOT / "examples" / "keras_digits.py"), "--epochs", "1"])
    out, err = capfd.readouterr()
    assert code == 0, err
    tf_lines = re.findall(r"^\[\d\]<stderr>:(?:WARNING: All log messages|[IWE]\d{4} \d\d:\d\d:\d\d)", err, re.M)
    assert tf_lines == [], err  # was 6 of the example's 14 lines: the absl notice and oneDNN, twice, on rank 0
    assert "weights identical on all ranks: True" in out


def test_killed_rank_is_reported(capfd, deadline):
    deadline(60)
    tag = uuid.uuid4().hex
    code = main(["-np", "2", *ranks("kill_self", tag)])
    _, err = capfd.readouterr()
    assert code == 128 + signal.SIGKILL, err
    assert "rank 1 (on " in err and "was killed by SIGKILL" in err
    time.sleep(0.5)
    assert leftovers(tag) == []


@pytest.mark.wall_clock
def test_ctrl_c_stops_every_rank(capfd):
    tag = uuid.uuid4().hex
    done = threading.Event()

    def ctrl_c_when_ready() -> None:
        # SIGINT to this process once both ranks' grandchildren run, as a terminal's Ctrl-C would.
        give_up = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < give_up:
            if sum("time.sleep(300)" in line for line in leftovers(tag)) >= 2:
                break
            time.sleep(0.2)
        if not done.is_set():
            time.sleep(0.5)  # let the ranks' "ready" lines reach us
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_when_ready, daemon=True).start()
    try:
        start = time.monotonic()
        code = main(["-np", "2", *ranks("hang_with_child", tag)])
    finally:
        done.set()
    out, err = capfd.readouterr()
    assert "[0]<stdout>:ready 0" in out and "[1]<stdout>:ready 1" in out, err
    assert code == 128 + signal.SIGINT and "received SIGINT, stopping all ranks" in err
    assert time.monotonic() - start < 20
    time.sleep(0.5)
    assert leftovers(tag) == []


def start_hanging_job(tag: str) -> subprocess.Popen:
    """The real console script in its own process group, returned once both ranks' children run.

    Raises:
        AssertionError: when the ranks do not get ready (the job is then killed).
    """
    script = shutil.which("smdistrun", path=str(VENV_BIN)) or shutil.which("smdistrun")
    cmd = [script] if script else [sys.executable, "-m", "smdist_tf.run"]
    proc = subprocess.Popen(cmd + ["-np", "2", *ranks("hang_with_child", tag)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=dict(os.environ),
                            cwd=ROOT, start_new_session=True)
    ready = set()
    give_up = time.monotonic() + 90  # the launcher imports TensorFlow with smdist_tf
    while len(ready) < 2 and time.monotonic() < give_up:
        line = proc.stdout.readline()
        if not line:
            break
        ready.update(m.group(1) for m in [re.match(r"\[(\d)\]<stdout>:ready", line)] if m)
    if len(ready) < 2:
        err = proc.stderr.read() if proc.poll() is not None else "ranks never got ready"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(err)
    return proc


def test_sigterm_to_smdistrun_leaves_no_orphans():
    """smdistrun stopped with SIGTERM once ranks are up."""
    tag = uuid.uuid4().hex
    proc = start_hanging_job(tag)
    try:
        assert leftovers(tag), "the grandchildren should be running now"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        err = proc.stderr.read()
        assert code == 128 + signal.SIGTERM, err
        assert "received SIGTERM, stopping all ranks" in err
        time.sleep(0.5)
        assert leftovers(tag) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("victim", ["smdistrun", "mpirun", "rank agents"])
def test_sigkill_of_the_launcher_leaves_no_orphans(victim):
    """SIGKILL allows no cleanup: mpirun gets SIGTERM when smdistrun dies, each rank's agent stops its
    program and everything the program started when mpirun dies, and a rank agent's guard does it when the
    agent itself is killed (mpirun kills an agent that is too slow to act on its SIGTERM)."""
    tag = uuid.uuid4().hex
    proc = start_hanging_job(tag)
    try:
        assert len([line for line in leftovers(tag) if "time.sleep(300)" in line]) == 2
        if victim == "smdistrun":
            os.kill(proc.pid, signal.SIGKILL)
        elif victim == "mpirun":
            (mpirun,) = [int(line.split()[0]) for line in leftovers(tag) if "prterun" in line or "mpirun" in line]
            os.kill(mpirun, signal.SIGKILL)
        else:  # mpirun's children only: each agent's guard carries the agent's command line too
            (mpirun,) = [line.split()[0] for line in leftovers(tag) if "prterun" in line or "mpirun" in line]
            agents = subprocess.run(["pgrep", "-P", mpirun], capture_output=True, text=True, timeout=10).stdout.split()
            assert len(agents) == 2, leftovers(tag)
            for agent in agents:
                os.kill(int(agent), signal.SIGKILL)
        give_up = time.monotonic() + 15
        while leftovers(tag) and time.monotonic() < give_up:
            time.sleep(0.2)
        assert leftovers(tag) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for line in leftovers(tag):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def test_start_timeout(capfd, deadline):
    deadline(60)
    code = main(["-np", "2", "--start-timeout", "0.001", *ranks("echo", uuid.uuid4().hex)])
    _, err = capfd.readouterr()
    assert code == 1 and "ranks started within 0.001 s (--start-timeout)" in err


@pytest.mark.parametrize("make_argv", [
    lambda marker, tmp: ["-np", "2", "-H", "no-such-host.invalid:2", "touch", marker],
    lambda marker, tmp: ["-np", "3", "-H", "localhost:2", "touch", marker],
    lambda marker, tmp: ["-np", "2"],
    lambda marker, tmp: ["-np", "2", "--hostfile", tmp, "touch", marker],
], ids=["unknown-host", "np-over-slots", "missing-command", "bad-hostfile-line"])
@pytest.mark.wall_clock
def test_bad_arguments_exit_2_and_start_nothing(make_argv, tmp_path, capfd):
    marker = tmp_path / "started"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\nlocalhost slots two\n")
    start = time.monotonic()
    assert main(make_argv(str(marker), str(hostfile))) == 2
    out, err = capfd.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("smdistrun: error: ")
    assert not marker.exists()
    assert time.monotonic() - start < 10


# ---------------------------------------------------------------- smdist_tf.run(fn, ...)

def test_programmatic_run_returns_each_ranks_result(deadline):
    deadline(120)
    from tests.mp import launcher_ranks as fns

    assert smdist_tf.run(fns.add_rank, args=(40,), kwargs={"y": 2}, np=3) == [
        {"rank": r, "sum": 42} for r in range(3)]
    # With the engine: every rank sees the same allreduce result.
    results = smdist_tf.run(fns.allreduce_info, args=(1.5,), np=2, cycle_time_ms=1)
    assert results == [{"rank": r, "size": 2, "local_rank": r, "sum": 4.5} for r in range(2)]


def test_programmatic_run_raises_with_the_failing_ranks_traceback(deadline):
    deadline(60)
    from tests.mp import launcher_ranks as fns

    with pytest.raises(RunError, match=r"(?s)rank 1 exited with code 1.*ValueError: rank one refuses") as info:
        smdist_tf.run(fns.raise_on_rank_one, np=2)
    assert info.value.failed_rank == 1 and info.value.exit_code == 1


# ---------------------------------------------------------------- two hosts as network namespaces

@pytest.fixture
def two_netns_hosts(tmp_path):
    """Two namespaces joined by a veth pair, 10.213.7.1 and 10.213.7.2; removed afterwards."""
    try:
        with two_namespace_hosts(tmp_path) as hosts:
            yield hosts
    except Unavailable as why:
        pytest.skip(str(why))


def test_two_hosts_in_network_namespaces(two_netns_hosts):
    """2 hosts x 2 ranks: ranks on "hostb" start through the netns agent, talk over the veth."""
    h = two_netns_hosts
    launcher = [sys.executable, "-m", "smdist_tf.run", "-np", "4", "-H", f"{h['ip_a']}:2,{h['ip_b']}:2",
                "--hierarchical-allreduce", "--mpi-args", f"--prtemca plm_ssh_agent {h['agent']}",
                *ranks("topology", uuid.uuid4().hex)]
    # The launcher runs on "hosta": inside the first namespace, with that hostname.
    cmd = [*h["launch_prefix"], *launcher]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    reports = [json.loads(m) for m in re.findall(r"^\[\d\]<stdout>:TOPO (.*)$", done.stdout, re.M)]
    assert len(reports) == 8, done.stdout
    for info in reports:
        r = info["rank"]
        assert info["ok"], info
        assert (info["size"], info["local_size"], info["cross_size"]) == (4, 2, 2), info
        assert (info["local_rank"], info["cross_rank"]) == (r % 2, r // 2), info
        if info["hierarchical"] is not None:  # once the engine reports it
            assert info["hierarchical"] == (info["mode"] == "launcher"), info


# What the Kubeflow MPI Operator (v2beta1) puts in its launcher pod's environment for Open MPI, less
# OMPI_MCA_plm_rsh_args (ssh options, which would reach the namespace agent that stands in for ssh here).
MPI_OPERATOR_ENV = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                    "OMPI_MCA_orte_set_default_slots": "2"}


def ranks_by_host(stdout: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rank, host in re.findall(r"^\[\d\]<stdout>:WHERE (\d+) (\S+) ", stdout, re.M):
        found.setdefault(host, []).append(int(rank))
    return {host: sorted(r) for host, r in found.items()}


def test_mpi_operator_hostfile_and_discovery_script_on_two_hosts(two_netns_hosts, tmp_path):
    """An MPIJob launcher pod, replayed on the two namespace hosts: no -H and no -np, the hosts and slots come
    from the hostfile the operator mounts; then elastic, from its discover_hosts.sh (bare names)."""
    h = two_netns_hosts
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{h['ip_a']} slots=2\n{h['ip_b']} slots=2\n")  # the operator's form
    discover = tmp_path / "discover_hosts.sh"
    discover.write_text(f"#!/bin/sh\necho {h['ip_a']}\necho {h['ip_b']}\n")
    discover.chmod(0o555)
    env = {**os.environ, **MPI_OPERATOR_ENV, "OMPI_MCA_orte_default_hostfile": str(hostfile)}
    agent = ["--mpi-args", f"--prtemca plm_ssh_agent {h['agent']}"]
    tag = uuid.uuid4().hex
    said = []
    for how in (["--verbose"], ["--verbose", "--host-discovery-script", str(discover), "--max-restarts", "0"]):
        cmd = [*h["launch_prefix"], sys.executable, "-m", "smdist_tf.run", *how, *agent, *ranks("where", tag)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
        assert ranks_by_host(done.stdout) == {"hosta": [0, 1], "hostb": [2, 3]}, done.stdout
        said.append(done.stderr)
    assert f"kubernetes detected: hosts {h['ip_a']}:2,{h['ip_b']}:2" in said[0], said[0]


def test_a_lost_host_fails_the_job(two_netns_hosts, tmp_path):
    """Every process of one host dies (a worker pod deleted, a node lost): Open MPI 5's mpirun then exits 0,
    and smdistrun must not. It exits 1, naming the ranks that never finished."""
    h = two_netns_hosts
    tag = uuid.uuid4().hex
    cmd = [*h["launch_prefix"], sys.executable, "-m", "smdist_tf.run", "-H", f"{h['ip_a']}:2,{h['ip_b']}:2",
           "--mpi-args", f"--prtemca plm_ssh_agent {h['agent']}", *ranks("hang_with_child", tag)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        # Every rank has started its child (hang_with_child), so has reported its start.
        while sum("time.sleep(300)" in line for line in leftovers(tag)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # the start reports travel through mpirun
        pids = subprocess.run(["ip", "netns", "pids", h["ns_b"]], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 1, out[-3000:] + err[-3000:]
    assert re.search(r"smdistrun: mpirun ended before ranks [\d, ]+ \(on [^)]*hostb[^)]*\) finished", err), err
    time.sleep(0.5)
    assert leftovers(tag) == []


# ---------------------------------------------------------------- MPICH (opt-in)

@pytest.mark.skipif(not os.environ.get("SMDIST_TEST_MPICH_MPIRUN"),
                    reason="set SMDIST_TEST_MPICH_MPIRUN to an MPICH (Hydra) mpirun to test the MPICH command")
def test_mpich_tagging_failure_and_flags(monkeypatch, capfd, deadline):
    deadline(60)
    monkeypatch.setenv("SMDIST_MPIRUN", os.environ["SMDIST_TEST_MPICH_MPIRUN"])
    tag = uuid.uuid4().hex
    assert main(["-np", "2", "--cycle-time-ms", "4", *ranks("echo", tag)]) == 0
    out, _ = capfd.readouterr()
    for r in range(2):
        assert f"[{r}]<stdout>:hello {r} {tag}" in out and '"HOROVOD_CYCLE_TIME": "4"' in out
    assert main(["-np", "3", *ranks("fail_one", tag)]) == 7
    assert "rank 2 (on " in capfd.readouterr().err
    time.sleep(0.5)
    assert leftovers(tag) == []
