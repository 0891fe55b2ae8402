"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd in a temporary directory.

Debian's packages give it (``apt-get install slurmctld slurmd slurm-client munge``, plus ``libpmix-dev``
for ``srun --mpi=pmix``); it starts in 1-2 s. Everything it writes stays in the directory it is given
(configuration, state, logs, the munge key and socket), on ports picked free, so it touches nothing else on
the machine. Needs root: slurmd starts the jobs' processes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel")
READY_TIMEOUT_S = 30.0


class Unavailable(RuntimeError):
    """Slurm cannot run here: not root, or its packages are not installed."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(d: Path, node: str) -> str:
    # config_overrides: the node's CPUs as written here, so that two ranks fit on a one-core machine too.
    cpus = max(2, os.cpu_count() or 1)
    return f"""ClusterName=smdisttest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def one_node_slurm(workdir: str | os.PathLike) -> Iterator[tuple[str, dict[str, str]]]:
    """Starts the cluster in ``workdir``; yields the node's name and the environment Slurm's commands
    need (this one's, with ``SLURM_CONF``).

    Raises:
        Unavailable: with the reason, before anything is started.
        RuntimeError: when the node does not become idle within ``READY_TIMEOUT_S`` (with the daemons' logs).
    """
    if os.geteuid() != 0:
        raise Unavailable("slurmd needs root")
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        raise Unavailable(f"Slurm is not installed ({', '.join(missing)} missing): "
                          "apt-get install slurmctld slurmd slurm-client munge libpmix-dev")
    d = Path(workdir)
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(secrets.token_bytes(128))
    key.chmod(0o600)
    node = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(_config(d, node))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons: list[subprocess.Popen] = []
    try:
        # In the foreground (-F, -D): they are our children, stopped below whatever happens.
        daemons.append(subprocess.Popen(
            ["munged", "-F", "--force", f"--socket={d}/munge.socket", f"--key-file={key}",
             f"--log-file={d}/munged.log", f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (d / "munge.socket").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for daemon in ("slurmctld", "slurmd"):
            extra = ["-c"] if daemon == "slurmctld" else []  # -c: no state from an earlier run
            daemons.append(subprocess.Popen([daemon, "-D", "-f", str(conf), *extra], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            if state.stdout.strip() == "idle":
                break
            time.sleep(0.2)
        else:
            logs = "".join((d / f"{name}.log").read_text()[-2000:] for name in ("slurmctld", "slurmd")
                           if (d / f"{name}.log").exists())
            raise RuntimeError(f"the Slurm node did not become idle in {READY_TIMEOUT_S:g} s:\n{logs}")
        yield node, env
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
        for process in reversed(daemons):
            _stop(process)


def run_batch(script: str, env: dict[str, str], workdir: Path, timeout: float) -> tuple[str, str]:
    """``sbatch``es ``script`` and waits for it to end; returns (its final state, its output).

    Polls ``scontrol`` every 0.2 s (``sbatch --wait`` polls only every few seconds).
    """
    path = workdir / "job.sh"
    path.write_text(script)
    out = workdir / "job.out"
    job = subprocess.run(["sbatch", "--parsable", f"--output={out}", str(path)], env=env, capture_output=True,
                         text=True, check=True, cwd=workdir).stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    state = "PENDING"
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", job, "-o"], env=env, capture_output=True, text=True)
        state = next((w.split("=", 1)[1] for w in shown.stdout.split() if w.startswith("JobState=")), state)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(0.2)
    else:
        subprocess.run(["scancel", job], env=env, capture_output=True)
        state = f"TIMEOUT after {timeout:g} s (was {state})"
    return state, out.read_text() if out.exists() else ""
