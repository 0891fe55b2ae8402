"""Finds mpirun, tells Open MPI from MPICH, and builds the command line for each."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from smdist_tf.run.checks import ENV_NAME_RE, check_interface, check_word
from smdist_tf.run.errors import UsageError
from smdist_tf.run.hosts import Host, hosts_string

_PACKAGE_DIR = Path(__file__).resolve().parent.parent

# Never forwarded to remote ranks: per-shell or per-machine values, and the
# variables of an MPI job we might ourselves be running inside.
_NOT_EXPORTED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "HYDRA_", "SLURM_", "BASH_FUNC_", "SSH_")
_NOT_EXPORTED = {"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "TERMCAP", "DISPLAY", "LS_COLORS", "PS1",
                 "PROMPT_COMMAND", "SMDIST_HOSTNAME", "TMUX", "TMUX_PANE", "STY", "WINDOW"}


@dataclass(frozen=True)
class MpiFlavour:
    """Which mpirun we drive: ``openmpi`` (with its major version) or ``mpich`` (Hydra)."""

    name: str
    major: int = 0
    version: str = ""


def parse_version_output(text: str) -> MpiFlavour:
    """Reads ``mpirun --version``. Open MPI prints "mpirun (Open MPI) 5.0.x"; Hydra-based MPIs
    (MPICH, Intel MPI, MVAPICH) print "HYDRA build details" or their name.

    Raises:
        UsageError: when the output matches neither.
    """
    match = re.search(r"\(Open(?: MPI|RTE)\)\s+(\d+)\.(\d+)\.?(\S*)", text) or re.search(r"Open MPI.*?(\d+)\.(\d+)", text)
    if match:
        return MpiFlavour("openmpi", int(match.group(1)), ".".join(g for g in match.groups() if g))
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", text, re.I):
        version = re.search(r"Version:\s*(\S+)", text)
        return MpiFlavour("mpich", 0, version.group(1) if version else "")
    first = text.strip().splitlines()[0] if text.strip() else "no output"
    raise UsageError(f"cannot tell which MPI this mpirun belongs to (mpirun --version said: {first!r})")


def find_mpirun(environ: Mapping[str, str]) -> str:
    """``SMDIST_MPIRUN`` if set, else the mpirun of the MPI smdist_tf was built with, else PATH's.

    Raises:
        UsageError: when there is none.
    """
    if environ.get("SMDIST_MPIRUN"):
        return environ["SMDIST_MPIRUN"]
    try:
        # build_info.json is read directly: no TensorFlow import just to find mpirun.
        mpicxx = json.loads((_PACKAGE_DIR / "build_info.json").read_text()).get("mpicxx", "")
        candidate = Path(mpicxx).parent / "mpirun"
        if mpicxx and os.access(candidate, os.X_OK):
            return str(candidate)
    except (OSError, ValueError):
        pass
    found = shutil.which("mpirun", path=environ.get("PATH"))
    if not found:
        raise UsageError("mpirun not found: install MPI, put it on PATH, or set SMDIST_MPIRUN")
    return found


def detect_flavour(mpirun: str) -> MpiFlavour:
    """Runs ``mpirun --version`` (a few seconds at most)."""
    try:
        done = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"cannot run {mpirun} --version: {e}") from None
    return parse_version_output(done.stdout + done.stderr)


def exported_names(environ: Mapping[str, str], remote: bool, always: list[str]) -> list[str]:
    """Names of the variables mpirun must forward to the ranks.

    Local ranks inherit mpirun's environment anyway; remote ranks get only what is
    forwarded, so with remote hosts we forward the whole environment (minus
    per-shell and MPI-internal variables), as users of horovodrun expect.
    """
    names = list(dict.fromkeys(always))
    if remote:
        for name in sorted(environ):
            if (name not in _NOT_EXPORTED and not name.startswith(_NOT_EXPORTED_PREFIXES)
                    and ENV_NAME_RE.fullmatch(name) and "\n" not in environ[name]
                    and name not in names):
                names.append(name)
    return names


def _has_flag(args: list[str], *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in args)


def _sets_mca(args: list[str], *names: str) -> bool:
    """Whether ``args`` set one of the MCA parameters ``names`` (``--mca btl tcp,self``)."""
    return any(a in ("--mca", "-mca") and args[i + 1:i + 2] in ([n] for n in names) for i, a in enumerate(args))


@dataclass
class MpiJob:
    """Everything the mpirun command depends on."""

    mpirun: str
    flavour: MpiFlavour
    np: int
    rank_command: list[str]
    hosts: list[Host] | None = None  # None: this machine only
    oversubscribe: bool = False
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    network_interfaces: list[str] = field(default_factory=list)
    mpi_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # values mpirun's environment holds
    export: list[str] = field(default_factory=list)  # names to forward to the ranks
    as_root: bool = False
    tcp_only: bool = False  # horovodrun's --tcp: no InfiniBand or other fabric, TCP between hosts


def _ssh_options(job: MpiJob) -> list[str]:
    # Both MPIs take these as one string they split on whitespace, so each must be one
    # word; checked here too, whoever built the job.
    options = []
    if job.ssh_port:
        options += ["-p", str(int(job.ssh_port))]
    if job.ssh_identity_file:
        options += ["-i", check_word(job.ssh_identity_file, "ssh identity file")]
    return options


def build_openmpi(job: MpiJob) -> list[str]:
    """Open MPI 4 (ORTE) or 5 (PRRTE) command line."""
    v5 = job.flavour.major >= 5
    cmd = [job.mpirun]
    if job.as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["-np", str(job.np)]
    if job.hosts:
        cmd += ["-H", hosts_string(job.hosts)]
    if job.oversubscribe:
        cmd.append("--oversubscribe")
    # Each rank runs a multi-threaded TensorFlow: pinning it to one core (Open MPI's
    # default for small jobs) starves it, so bind to nothing and fill hosts in order.
    if not _has_flag(job.mpi_args, "--bind-to", "-bind-to"):
        cmd += ["--bind-to", "none"]
    if not _has_flag(job.mpi_args, "--map-by", "-map-by"):
        cmd += ["--map-by", "slot"]
    if job.tcp_only and not _sets_mca(job.mpi_args, "pml", "btl"):
        # ob1 with these byte-transfer layers only: shared memory on a host, TCP between hosts
        # (Open MPI 5 calls its shared-memory layer sm, Open MPI 4 vader).
        cmd += ["--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp" if v5 else "self,vader,tcp"]
    launcher_mca = ["--prtemca"] if v5 else ["--mca"]
    ssh_options = _ssh_options(job)
    if ssh_options:
        cmd += launcher_mca + ["plm_ssh_args" if v5 else "plm_rsh_args", " ".join(ssh_options)]
    if job.network_interfaces:
        ifaces = ",".join(check_interface(name) for name in job.network_interfaces)
        cmd += ["--mca", "btl_tcp_if_include", ifaces]
        cmd += launcher_mca + ["oob_tcp_if_include", ifaces]
    for name in job.export:
        cmd += ["-x", name]
    return cmd + job.mpi_args + job.rank_command


def build_mpich(job: MpiJob) -> list[str]:
    """MPICH Hydra (also Intel MPI and MVAPICH) command line."""
    cmd = [job.mpirun, "-n", str(job.np)]
    if job.hosts:
        cmd += ["-hosts", hosts_string(job.hosts)]
    if _ssh_options(job):
        cmd += ["-launcher", "ssh"]  # the options themselves go in launcher_env()
    if job.network_interfaces:
        cmd += ["-iface", check_interface(job.network_interfaces[0])]  # Hydra takes one interface
    # Hydra forwards the whole environment by default; -genv states our values explicitly.
    for name in job.export:
        if name in job.env:
            cmd += ["-genv", name, job.env[name]]
    # Hydra oversubscribes and does not bind by default, which is what we want.
    return cmd + job.mpi_args + job.rank_command


def launcher_env(job: MpiJob) -> dict[str, str]:
    """Variables mpirun itself must see: Hydra's ssh options (Open MPI needs none).

    Hydra's ``-launcher-exec`` names the ssh executable, it takes no arguments; Hydra adds
    the words of ``HYDRA_LAUNCHER_EXTRA_ARGS`` (Intel MPI: ``I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS``)
    to each ssh command instead.
    """
    ssh_options = _ssh_options(job)
    if job.flavour.name != "mpich" or not ssh_options:
        return {}
    words = " ".join(ssh_options)
    return {"HYDRA_LAUNCHER_EXTRA_ARGS": words, "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": words}


def build_command(job: MpiJob) -> list[str]:
    """The mpirun command line for ``job.flavour``."""
    return build_openmpi(job) if job.flavour.name == "openmpi" else build_mpich(job)
