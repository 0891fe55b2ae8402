"""Restarts: start the whole job again when a rank fails (``--max-restarts``, ``--host-discovery-script``).

A failed rank cannot be replaced inside a running MPI job, so a restart is a new
``mpirun`` with a new launch token. Ranks tell the attempts apart by
``SMDIST_RESTART_COUNT`` (0, 1, ...) and find the last ``smdist_tf.elastic`` commit
in ``SMDIST_ELASTIC_DIR``, which stays the same for the whole launch. With a host
discovery script, every attempt starts on the hosts the script lists at that moment.

Only a rank's failure (a non-zero exit or a signal, or mpirun failing under it) is
restarted: not success, not Ctrl-C/SIGTERM to smdistrun, not a start timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from typing import IO, Callable, Mapping

from smdist_tf.run import hosts as hostlib
from smdist_tf.run.args import LaunchSettings, effective_max_restarts, min_np
from smdist_tf.run.errors import UsageError
from smdist_tf.run.host_discovery import Discovered, DiscoveryError, discover
from smdist_tf.run.attempt import STOP_SIGNALS, LaunchPlan, launch, plan, say
from smdist_tf.run.supervisor import Outcome

RESTART_COUNT_ENV = "SMDIST_RESTART_COUNT"
ELASTIC_DIR_ENV = "SMDIST_ELASTIC_DIR"
RESTART_BACKOFF_S = 1.0  # before the first restart; doubles for each further one
RESTART_BACKOFF_MAX_S = 30.0


@dataclass
class JobResult:
    """How a launch ended: the last attempt's outcome and plan (None if nothing was started)."""

    outcome: Outcome
    plan: LaunchPlan | None


def backoff_s(restart: int) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...): 1, 2, 4, ... up to 30."""
    return min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (restart - 1))


def restart_cause(outcome: Outcome) -> str | None:
    """Why a job that ended this way may be restarted, or None when it must not be.

    None for success, for a stop that smdistrun was asked for (Ctrl-C, SIGTERM,
    SIGHUP), and for a start timeout (restarting would time out again).
    """
    if outcome.exit_code == 0 or outcome.interrupted_by is not None or outcome.start_timed_out:
        return None
    if outcome.failed_rank is not None:
        return outcome.failed_rank.describe(outcome.started.get(outcome.failed_rank.rank))
    return outcome.reason or f"the job exited with code {outcome.exit_code}"


class _StopRequests:
    """Between attempts (main thread only), SIGINT/SIGTERM/SIGHUP end the launch instead of killing smdistrun.

    During an attempt ``launch()`` installs its own handlers, which stop the ranks.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum
        self.event.set()

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def stopped(self, err: IO, last: JobResult | None) -> JobResult:
        """The result of a launch that a signal ended between attempts."""
        name = signal.Signals(self.signum).name
        say(err, f"received {name}, not starting the job again")
        outcome = Outcome(exit_code=128 + self.signum, reason=f"interrupted by {name}", interrupted_by=self.signum)
        return JobResult(outcome, last.plan if last else None)


def _discover(s: LaunchSettings, stop: _StopRequests, err: IO) -> Discovered | None:
    """The hosts and -np for the next attempt; None when a signal came while waiting.

    Raises:
        DiscoveryError: the script failed, or too few slots appeared in time.
    """
    def waiting(hosts: list[hostlib.Host]) -> None:
        say(err, f"waiting up to {s.elastic_timeout:g} s for {min_np(s)} slots "
                 f"(host discovery found {hostlib.hosts_string(hosts) or 'none'})")

    return discover(s.host_discovery_script, s.slots_per_host, min_np(s), s.max_np, s.elastic_timeout,
                    stop.event, on_wait=waiting)


def run_with_restarts(s: LaunchSettings, environ: Mapping[str, str] | None = None,
                      rank_command: list[str] | None = None,
                      before_attempt: Callable[[int], None] | None = None,
                      stdout: IO | None = None, stderr: IO | None = None) -> JobResult:
    """Plans and launches the job, and launches it again after a rank failure, up to the restart limit.

    Args:
        s: parsed settings.
        environ: the environment to launch with; ``os.environ`` when None.
        rank_command: what each rank runs; ``s.command`` when None.
        before_attempt: called with the restart count (0 first) before each attempt starts.
        stdout, stderr: where the ranks' output and our messages go; ours by default.

    Returns:
        The last attempt's result; its exit code is the launch's.

    Raises:
        UsageError: the first attempt could not be planned (nothing was started).
    """
    environ = dict(os.environ if environ is None else environ)
    err = stderr or sys.stderr
    max_restarts = effective_max_restarts(s)
    made_dir = None
    elastic_dir = s.elastic_dir
    if elastic_dir is None and max_restarts > 0:
        # Commits must outlive an attempt; a fresh directory per launch, removed at the end.
        made_dir = elastic_dir = tempfile.mkdtemp(prefix="smdist_elastic_")
    rank_env = {ELASTIC_DIR_ENV: elastic_dir} if elastic_dir else {}
    last: JobResult | None = None
    layout: Discovered | None = None
    try:
        with _StopRequests() as stop:
            restarts = 0
            while True:
                attempt = s
                if s.host_discovery_script:
                    try:
                        found = _discover(s, stop, err)
                    except DiscoveryError as e:
                        say(err, str(e) if last is None else f"cannot restart: {e}")
                        return last or JobResult(Outcome(exit_code=1, reason=str(e)), None)
                    if found is None:
                        return stop.stopped(err, last)
                    if layout is not None and found != layout and not s.verbose:  # verbose notes say it anyway
                        say(err, f"host discovery changed the job: {found.describe()}")
                    layout = found
                    attempt = replace(s, hosts=hostlib.hosts_string(found.hosts), hostfile=None, np=found.np)
                if before_attempt is not None:
                    before_attempt(restarts)
                try:
                    p = plan(attempt, environ, rank_command, {**rank_env, RESTART_COUNT_ENV: str(restarts)})
                except UsageError as e:
                    if last is None:
                        raise
                    say(err, f"cannot restart: {e}")
                    return last
                if stop.event.is_set():  # a signal while planning: launch() would not see it
                    return stop.stopped(err, last)
                if layout is not None:
                    p.notes.insert(0, f"host discovery: {layout.describe()}")
                if rank_env:
                    p.notes.append(f"{ELASTIC_DIR_ENV}={elastic_dir}" + (" (made for this launch)" if made_dir else ""))
                last = JobResult(launch(p, verbose=s.verbose, stdout=stdout, stderr=stderr), p)
                cause = restart_cause(last.outcome)
                if cause is None:
                    return last
                if restarts >= max_restarts:
                    if max_restarts > 0:
                        say(err, f"not restarting: all {max_restarts} restarts (--max-restarts) are used")
                    return last
                restarts += 1
                delay = backoff_s(restarts)
                say(err, f"restart {restarts} of {max_restarts} in {delay:g} s: {cause}")
                if stop.event.wait(delay):
                    return stop.stopped(err, last)
    finally:
        if made_dir:
            shutil.rmtree(made_dir, ignore_errors=True)
