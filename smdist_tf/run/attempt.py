"""One attempt of a job: ``plan()`` turns settings into an mpirun command without starting
anything, and ``launch()`` runs a plan to its end.

``restarts.run_with_restarts()`` plans and launches again after a failure; ``launcher.main()``
(the ``smdistrun`` command) and the programmatic ``smdist_tf.run(fn)`` go through it.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping

from smdist_tf.run import cluster, hosts as hostlib
from smdist_tf.run.args import LaunchSettings
from smdist_tf.run.errors import UsageError
from smdist_tf.run.mpi_command import (
    MpiJob, build_command, detect_flavour, exported_names, find_mpirun, launcher_env,
)
from smdist_tf.run.rank_agent import TOKEN_ENV
from smdist_tf.run.session_dir import private_session_base, session_base_variable
from smdist_tf.run.settings_check import settings_error
from smdist_tf.run.supervisor import Outcome, Supervisor
from smdist_tf.run.tuning_env import tuning_env

RANK_AGENT = str(Path(__file__).resolve().parent / "rank_agent.py")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class LaunchPlan:
    """A ready-to-run job: the mpirun command and its environment."""

    command: list[str]
    env: dict[str, str]
    np: int
    token: str
    start_timeout: float
    notes: list[str]  # what the launcher decided, shown with --verbose
    session_base_variable: str | None = None  # set to a private directory for each launch


# What smdistrun sets TF_CPP_MIN_LOG_LEVEL to for the ranks when the user did not (2: errors only, as scripts/env.sh).
QUIET_TF_LOG_LEVEL = "2"


def say(stream: IO, text: str) -> None:
    """Writes one ``smdistrun: ...`` line and flushes it."""
    stream.write(f"smdistrun: {text}\n")
    stream.flush()


def resolve_hosts(s: LaunchSettings, environ: Mapping[str, str], notes: list[str]) -> list[hostlib.Host] | None:
    """Hosts from -H, --hostfile, or the cluster manager; None means this machine only.

    Raises:
        UsageError: bad host list or hostfile, or a host that does not resolve.
        NotLeader: on a SageMaker/Slurm host that is not the one that starts the job.
    """
    if s.hosts:
        found = hostlib.parse_host_string(s.hosts)
    elif s.hostfile:
        found = hostlib.parse_hostfile(s.hostfile)
    else:
        info = cluster.detect(environ)
        if info is None:
            return None
        notes.append(f"{info.kind} detected: hosts {hostlib.hosts_string(info.hosts)}")
        if not info.is_leader:
            raise NotLeader(f"{info.kind} host {info.current_host} is not the leader ({info.leader}); "
                             f"the leader's smdistrun starts the ranks here")
        found = info.hosts
    hostlib.check_resolvable(found)
    return found


class NotLeader(Exception):
    """This host is not the one that starts the job (SageMaker/Slurm): the leader's smdistrun starts its ranks."""


def plan(s: LaunchSettings, environ: Mapping[str, str] | None = None, rank_command: list[str] | None = None,
         rank_env: Mapping[str, str] | None = None) -> LaunchPlan:
    """Checks the settings against hosts and MPI and builds the mpirun command; starts nothing.

    Args:
        s: parsed settings.
        environ: the environment to launch with; ``os.environ`` when None.
        rank_command: what each rank runs; ``s.command`` when None.
        rank_env: variables every rank must see, also on remote hosts (the restart count, ...).

    Raises:
        UsageError: unknown host, -np larger than the slots, no mpirun, ...
    """
    environ = dict(os.environ if environ is None else environ)
    notes: list[str] = []
    hosts = resolve_hosts(s, environ, notes)
    cores = os.cpu_count() or 1
    if hosts is not None:
        slots = sum(h.slots for h in hosts)
        np = s.np if s.np is not None else slots
        if np > slots:
            raise UsageError(f"-np {np} is larger than the {slots} slots of {hostlib.hosts_string(hosts)}")
        remote = any(not hostlib.is_local(h.name) for h in hosts)
        oversubscribe = False  # the slots were given explicitly, mpirun honours them
    else:
        if s.np is None:
            raise UsageError("missing -np: say how many ranks to start (or give hosts with -H/--hostfile)")
        np, remote = s.np, False
        oversubscribe = np > cores
        if oversubscribe:
            notes.append(f"-np {np} exceeds the {cores} cores: oversubscribing, no binding")

    mpirun = find_mpirun(environ)
    flavour = detect_flavour(mpirun)
    notes.append(f"MPI: {flavour.name} {flavour.version} ({mpirun})")

    token = secrets.token_hex(8)
    extra = {**tuning_env(s), **(rank_env or {})}
    extra[TOKEN_ENV] = token
    extra["PYTHONUNBUFFERED"] = environ.get("PYTHONUNBUFFERED", "1")
    if "TF_CPP_MIN_LOG_LEVEL" not in environ and not s.verbose:
        extra["TF_CPP_MIN_LOG_LEVEL"] = QUIET_TF_LOG_LEVEL  # TensorFlow's INFO and WARNING lines: mostly noise
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if as_root and flavour.name == "openmpi":
        extra.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        extra.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if flavour.name == "openmpi" and "OMPI_MCA_osc" not in environ:
        # Open MPI's UCX one-sided component prints an "Error" line per rank wherever a rank's MPI_Init
        # (mpi4py's too) finds no UCX device; the shared-memory one serves one host, the engine's windows too.
        extra["OMPI_MCA_osc"] = "^ucx"
    env = {**environ, **extra}
    error = settings_error(env)  # before any rank imports TensorFlow only to refuse it
    if error:
        raise UsageError(error)

    # The Supervisor, not mpirun's abort, ends a job after a failure: mpirun's would drop output on its way.
    agent = [sys.executable, RANK_AGENT, "--wait-for-stop"]
    if s.output_filename:
        agent += ["--output-dir", os.path.abspath(s.output_filename)]
    if s.prefix_output_with_timestamp:
        agent.append("--timestamp-output")
    if not s.verbose:
        # TensorFlow's start-up lines: none by default; from rank 0 only when the user set
        # TF_CPP_MIN_LOG_LEVEL (they want TensorFlow's logs, and every rank prints the same).
        agent.append("--quiet-tf-startup" if "TF_CPP_MIN_LOG_LEVEL" in environ else "--quiet-tf-startup-all")
    job = MpiJob(
        mpirun=mpirun, flavour=flavour, np=np, rank_command=agent + ["--"] + list(rank_command or s.command),
        hosts=hosts, oversubscribe=oversubscribe, ssh_port=s.ssh_port, ssh_identity_file=s.ssh_identity_file,
        network_interfaces=s.network_interfaces, env=extra,
        # horovodrun's binding arguments: mpirun options of their own, before --mpi-args.
        mpi_args=shlex.split(s.binding_args or "") + s.mpi_args,
        export=exported_names(env, remote, [k for k in extra if not k.startswith("OMPI_")]),
        as_root=as_root and flavour.name == "openmpi", tcp_only=s.tcp,
    )
    if s.tcp and flavour.name != "openmpi":
        notes.append("--tcp: only Open MPI's transports are chosen by smdistrun; with MPICH the build decides")
    for name, value in launcher_env(job).items():
        env[name] = value  # for mpirun only: not in job.export
        notes.append(f"{name}={shlex.quote(value)}")
    if s.ignored_config:
        notes.append(f"config entries not used by smdist_tf: {', '.join(s.ignored_config)}")
    return LaunchPlan(build_command(job), env, np, token, s.start_timeout, notes,
                      session_base_variable(flavour, environ, remote))


def launch(p: LaunchPlan, verbose: bool = False, stdout: IO | None = None, stderr: IO | None = None) -> Outcome:
    """Runs a plan to the end: relays output, stops everything on failure or Ctrl-C/SIGTERM.

    Signal handlers are installed only when called from the main thread.
    """
    err = stderr or sys.stderr
    if verbose:
        for note in p.notes:
            say(err, note)
        say(err, shlex.join(p.command))
    with private_session_base(p.session_base_variable, p.env) as env:
        sup = Supervisor(p.command, env, p.np, p.token, p.start_timeout, stdout, stderr, quiet_exit_banner=not verbose)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                previous[sig] = signal.signal(sig, lambda signum, _frame: sup.interrupt(signum))
        try:
            outcome = sup.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if outcome.exit_code != 0 and outcome.failed_rank is not None and outcome.reason is None:
        host = outcome.started.get(outcome.failed_rank.rank)
        say(err, f"{outcome.failed_rank.describe(host)}; the other ranks were stopped")
    elif outcome.exit_code != 0 and outcome.reason and not outcome.reason.startswith(("interrupted", "only ")):
        say(err, outcome.reason)
    return outcome
