"""Runs mpirun, relays the ranks' output, and stops the whole job on failure or signal.

The rank agents (rank_agent.py) report each rank's start and exit with marker
lines on stderr; this module strips those from the output and uses them to
name the first rank that failed and to enforce the start timeout.

A failed rank's agent does not exit until it is stopped (mpirun would abort the job
and drop the other ranks' output still on its way), so this module stops the job:
once every rank has ended, or ``FAILURE_STOP_S`` after the first failure.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO

from smdist_tf.run.exit_banner import ExitBannerFilter
from smdist_tf.run.rank_agent import MARKER, parent_death_signal

STOP_GRACE_S = 5.0  # after SIGTERM, how long mpirun gets before SIGKILL
FAILURE_STOP_S = 1.0  # after a rank fails, how long the others get to end (and print) before the stop


@dataclass(frozen=True)
class RankExit:
    """How one rank ended, as its agent reported it."""

    rank: int
    code: int
    signal: int
    stopped: bool  # ended because it was told to stop (another rank failed, or Ctrl-C)

    def describe(self, host: str | None = None) -> str:
        """``rank 1 (on node7) exited with code 3`` / ``... was killed by SIGKILL ...``."""
        who = f"rank {self.rank} (on {host})" if host else f"rank {self.rank}"
        if self.signal:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"{who} was killed by {name} (exit code {self.code})"
        return f"{who} exited with code {self.code}"


@dataclass
class Outcome:
    """The job's result: the launcher's exit code and, when it failed, why."""

    exit_code: int
    failed_rank: RankExit | None = None
    reason: str | None = None
    started: dict[int, str] = field(default_factory=dict)  # rank -> host
    exits: dict[int, RankExit] = field(default_factory=dict)
    interrupted_by: int | None = None  # the signal that stopped smdistrun itself
    start_timed_out: bool = False


def _write(stream: IO, data: bytes) -> None:
    buffer = getattr(stream, "buffer", None)
    try:
        if buffer is not None:
            buffer.write(data)
        else:  # a text-only stream (e.g. a test capture)
            stream.write(data.decode(errors="replace"))
        stream.flush()
    except (BrokenPipeError, ValueError):
        pass


class Supervisor:
    """Starts one mpirun command and watches it until every rank is gone.

    Args:
        command: the full mpirun command line.
        env: mpirun's environment.
        np: the number of ranks, to know when all have started.
        token: the launch token the rank agents put in their markers.
        start_timeout: seconds for all ranks to report their start.
        stdout, stderr: where the ranks' (tagged) output goes; ours by default.
        quiet_exit_banner: leave out mpirun's own banner about a rank that exited non-zero
            (exit_banner.py): the launcher says it in one line.
    """

    def __init__(self, command: list[str], env: dict[str, str], np: int, token: str, start_timeout: float,
                 stdout: IO | None = None, stderr: IO | None = None, quiet_exit_banner: bool = False):
        self.command, self.env, self.np, self.start_timeout = command, env, np, start_timeout
        self.quiet_exit_banner = quiet_exit_banner
        self.prefix = f"{MARKER}{token} ".encode()
        self.stdout, self.stderr = stdout or sys.stdout, stderr or sys.stderr
        self.events: queue.Queue = queue.Queue()
        self.interrupted: int | None = None  # set from a signal handler
        self.proc: subprocess.Popen | None = None
        self.stopped_after_failure = False

    def _pump(self, pipe: IO[bytes], stream: IO) -> None:
        banner = ExitBannerFilter() if self.quiet_exit_banner else None
        for line in iter(pipe.readline, b""):
            if line.startswith(self.prefix):
                self.events.put(line[len(self.prefix):].decode(errors="replace").split())
            else:
                for kept in (banner.feed(line) if banner else [line]):
                    _write(stream, kept)
        for kept in (banner.flush() if banner else []):
            _write(stream, kept)

    def interrupt(self, signum: int) -> None:
        """Asks the job to stop (safe to call from a signal handler)."""
        self.interrupted = signum
        self.events.put(["wake"])

    def _terminate(self) -> None:
        """SIGTERM to mpirun (it stops its ranks), then SIGKILL to its whole process group."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        except ProcessLookupError:
            pass

    def run(self) -> Outcome:
        """Runs the job to the end; returns its Outcome."""
        # A session of its own: our Ctrl-C reaches mpirun only through us, and
        # the process group lets us kill everything mpirun started locally. If we
        # die, even by SIGKILL, mpirun gets SIGTERM and stops the ranks.
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=parent_death_signal(signal.SIGTERM))
        pumps = [threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout), daemon=True),
                 threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr), daemon=True)]
        for pump in pumps:
            pump.start()

        outcome = Outcome(exit_code=0)
        start_deadline = time.monotonic() + self.start_timeout
        stop_deadline: float | None = None
        stopping = False
        while True:
            try:
                event = self.events.get(timeout=0.2)
            except queue.Empty:
                event = None
            if event:
                self._record(event, outcome)
            if self.proc.poll() is not None:
                break
            now = time.monotonic()
            if self.interrupted is not None and not stopping:
                name = signal.Signals(self.interrupted).name
                _write(self.stderr, f"smdistrun: received {name}, stopping all ranks\n".encode())
                outcome.reason = f"interrupted by {name}"
                stopping = True
                threading.Thread(target=self._terminate, daemon=True).start()
            failed = any(e.code != 0 for e in outcome.exits.values())
            if failed and stop_deadline is None:
                stop_deadline = now + FAILURE_STOP_S
            every_rank_ended = len(outcome.exits) >= self.np
            if stop_deadline is not None and (now > stop_deadline or every_rank_ended) and not stopping:
                # Failed ranks' agents wait for this stop; mpirun has relayed the output of every rank that ended.
                stopping = self.stopped_after_failure = True
                threading.Thread(target=self._terminate, daemon=True).start()
            if len(outcome.started) < self.np and now > start_deadline and not stopping:
                outcome.reason = (f"only {len(outcome.started)} of {self.np} ranks started within "
                                  f"{self.start_timeout:g} s (--start-timeout)")
                outcome.start_timed_out = True
                _write(self.stderr, f"smdistrun: {outcome.reason}; stopping the job\n".encode())
                stopping = True
                threading.Thread(target=self._terminate, daemon=True).start()

        for pump, pipe in zip(pumps, (self.proc.stdout, self.proc.stderr)):
            pump.join(timeout=5.0)  # a remote shell may keep a pipe open a moment longer
            if not pump.is_alive():
                pipe.close()  # else the pump still reads it, and it is closed with the process object
        while not self.events.empty():
            self._record(self.events.get_nowait(), outcome)
        outcome.exit_code = self._exit_code(outcome, self.proc.returncode)
        return outcome

    @staticmethod
    def _record(event: list[str], outcome: Outcome) -> None:
        try:
            if event[0] == "start":
                outcome.started[int(event[1])] = event[2] if len(event) > 2 else "?"
            elif event[0] == "exit":
                rank_exit = RankExit(int(event[1]), int(event[2]), int(event[3]), event[4] == "1")
                outcome.exits[rank_exit.rank] = rank_exit
                # The first rank to fail on its own is the cause; ranks stopped after it are not.
                if rank_exit.code != 0 and not rank_exit.stopped and outcome.failed_rank is None:
                    outcome.failed_rank = rank_exit
        except (IndexError, ValueError):
            pass  # not one of ours after all

    def _exit_code(self, outcome: Outcome, mpirun_code: int) -> int:
        if self.interrupted is not None:
            outcome.interrupted_by = self.interrupted
            return 128 + self.interrupted
        if outcome.failed_rank is not None:
            return outcome.failed_rank.code
        if outcome.reason:  # start timeout
            return 1
        failed = [e for e in outcome.exits.values() if e.code != 0]
        if self.stopped_after_failure and failed:  # every failed rank only echoed another's
            outcome.failed_rank = failed[0]
            outcome.reason = f"{failed[0].describe(outcome.started.get(failed[0].rank))} after another rank ended"
            return failed[0].code
        if mpirun_code < 0:
            outcome.reason = f"mpirun was killed by signal {-mpirun_code}"
            return 128 - mpirun_code
        unfinished = sorted(set(range(self.np)) - set(outcome.exits))
        if mpirun_code == 0 and unfinished:
            # Open MPI 5's mpirun exits 0 when it loses a host ("PRTE has lost communication with a
            # remote daemon"): ranks that never reported their end did not succeed.
            hosts = sorted({outcome.started[r] for r in unfinished if r in outcome.started})
            where = f" (on {', '.join(hosts)})" if hosts else ""
            ranks = ", ".join(map(str, unfinished))
            outcome.reason = f"mpirun ended before rank{'s' if len(unfinished) > 1 else ''} {ranks}{where} finished"
            return 1
        if mpirun_code != 0:
            stopped = [e for e in outcome.exits.values() if e.code != 0]
            outcome.failed_rank = stopped[0] if stopped else None
            outcome.reason = f"mpirun exited with code {mpirun_code}"
        return mpirun_code
