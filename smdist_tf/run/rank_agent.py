"""Runs one rank's command under mpirun (started by path, standard library only).

Between mpirun and the user's program it:

* prefixes every line the program writes with its rank (``[1]<stdout>:...``), the same
  way for every MPI, and optionally copies the untagged output to
  ``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr`` on the host where the rank runs;
* tells the launcher when the rank started and how it ended, with marker lines on
  stderr that carry the launch's token (the launcher removes them from the output),
  so the launcher can name the rank that failed first and enforce ``--start-timeout``;
* forwards termination signals to the program and the processes it started (its own
  process group), and kills them if mpirun or its daemon disappears, or, through a forked
  guard, if the agent itself is killed before it could, so no rank outlives the job;
* with ``--wait-for-stop``, when the program fails, reports it and then waits to be stopped
  instead of exiting: a rank's non-zero exit makes mpirun abort the job, and from then on
  mpirun drops what the other ranks print (PRRTE issue #109), so the launcher ends the job
  itself once the other ranks have ended or had a moment to print;
* passes on the program's own word that its failure only echoes another rank's (an
  ``ECHO_EVENT`` marker line smdist_tf writes on stderr): such an exit is reported as
  stopped, so the launcher names the rank that failed first;
* with ``--quiet-tf-startup``, leaves out TensorFlow's start-up lines (absl's
  "before InitializeLog" notice, oneDNN, CPU features, CUDA registrations) on ranks
  other than 0: every rank prints the same ones, and TF_CPP_MIN_LOG_LEVEL does not
  silence those absl writes before its logging is set up; with ``--quiet-tf-startup-all``,
  on rank 0 too. The ``--output-dir`` copies keep them.
* with ``--timestamp-output``, puts the time before each tagged line (``Fri Nov 27 07:40:32 2026[1]<stdout>:``,
  as Open MPI's ``--timestamp-output`` does): horovodrun's ``--prefix-output-with-timestamp``.

Started as ``python rank_agent.py [--wait-for-stop] [--output-dir DIR] [--quiet-tf-startup[-all]] [--timestamp-output]
-- command ...``;
running it by path keeps each rank's start cheap (no package import, no TensorFlow).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

MARKER = "@smdistrun@"
TOKEN_ENV = "SMDISTRUN_TOKEN"
ECHO_EVENT = "failed-because-of-peer"
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_KILL_GRACE_S = 3.0
# How long a failed rank's agent waits for the launcher's stop (--wait-for-stop; the launcher stops
# the job 1 s after the first failure at most): only a launcher gone astray makes it exit on its own.
_FAILED_HOLD_S = 10.0
# TensorFlow's start-up lines, identical on every rank: absl's notice, then absl-formatted
# lines ("I0000 00:00:1795613081.366050   20408 port.cc:153] oneDNN custom operations ...")
# whose message starts with one of these.
_ABSL_NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_ABSL_LINE = re.compile(rb"^[IWE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] (.*)$")
_TF_STARTUP_MESSAGES = (
    b"oneDNN custom operations are on.",
    b"This TensorFlow binary is optimized to use available CPU instructions",
    b"Unable to register cuDNN factory", b"Unable to register cuFFT factory", b"Unable to register cuBLAS factory",
    b"computation placer already registered",
    b"TF-TRT Warning: Could not find TensorRT",
    b"Could not find cuda drivers on your machine",
)
# The CPU-feature message goes on with one more line of its own.
_CPU_FEATURES_MESSAGE, _CPU_FEATURES_CONTINUATION = _TF_STARTUP_MESSAGES[1], b"To enable the following instructions:"


def world_rank() -> int:
    """This process's rank as the MPI launcher announced it (Open MPI, PMIx or Hydra)."""
    for var in _RANK_VARS:
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def marker(event: str) -> None:
    """Writes one marker line for the launcher, in one write so it cannot be split."""
    line = f"{MARKER}{os.environ.get(TOKEN_ENV, '')} {event}\n".encode()
    try:
        os.write(2, line)
    except OSError:
        pass


def parent_death_signal(signum: int) -> Callable[[], None]:
    """A ``preexec_fn`` for Popen: the child gets ``signum`` when its parent dies, even by SIGKILL (Linux).

    Linux counts the parent as dead when the thread that started the child ends, so
    start the child from a thread that outlives it.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    except (OSError, AttributeError):  # not Linux: best effort
        prctl = None

    def set_it() -> None:
        if prctl is not None:
            prctl(1, signum)  # PR_SET_PDEATHSIG

    return set_it


def start_group_guard(program_group: int) -> int:
    """Forks a guard that stops the program's process group if this agent dies without doing so.

    mpirun kills an agent that is still alive a second after its SIGTERM; on a loaded machine that
    can come before the agent has forwarded the SIGTERM, and the program's own parent-death signal
    does not reach what the program started. The guard sits in a session of its own (a kill of the
    agent's group, or Ctrl-C, does not reach it), gets SIGTERM when the agent dies, and then stops
    the program's group as ``watch_parent`` would. Call it while the agent has only one thread.

    Returns:
        The guard's pid; the agent kills it when it ends normally.
    """
    agent = os.getpid()
    set_death_signal = parent_death_signal(signal.SIGTERM)
    # Blocked in the guard from its first instruction: its death signal waits for sigwait instead of killing it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    guard = os.fork()
    if guard:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return guard
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # mpirun's output pipes must not wait for the guard
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        set_death_signal()
        # A SIGTERM while the agent lives (pkill of the command line) is not the agent's death.
        while os.getppid() == agent:
            signal.sigwait({signal.SIGTERM})
        stop_process_group(program_group)
    finally:
        os._exit(0)


def stop_process_group(group: int) -> None:
    """SIGTERM to the group, then SIGKILL to what is left of it after a grace period."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + _KILL_GRACE_S
        while signum == signal.SIGTERM and time.monotonic() < deadline:
            time.sleep(0.1)
            if not group_has_live_members(group):
                return


def group_has_live_members(group: int) -> bool:
    """Whether a process of ``group`` is still running.

    Zombies do not count: an orphan's zombie stays in its group until the process that inherited it
    (init, or a subreaper) reaps it, which can take a second.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: any member, zombie or not
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True
    for pid in filter(str.isdigit, entries):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state, _parent, pgrp = stat[stat.rindex(b")") + 2:].split()[:3]
        if int(pgrp) == group and state not in (b"Z", b"X"):
            return True
    return False


class TensorFlowStartupFilter:
    """Recognises TensorFlow's start-up lines, one line at a time (a line may continue the one before)."""

    def __init__(self) -> None:
        self._continuation: bytes | None = None

    def __call__(self, line: bytes) -> bool:
        """Whether ``line`` (without its newline) is one of TensorFlow's start-up lines."""
        expected, self._continuation = self._continuation, None
        if expected is not None and line.startswith(expected):
            return True
        if line == _ABSL_NOTICE:
            return True
        absl = _ABSL_LINE.match(line)
        if absl is None or not absl.group(1).startswith(_TF_STARTUP_MESSAGES):
            return False
        if absl.group(1).startswith(_CPU_FEATURES_MESSAGE):
            self._continuation = _CPU_FEATURES_CONTINUATION
        return True


class _Pump(threading.Thread):
    """Copies one pipe to our stream, a tag before each line, and optionally to a file.

    Lines that are the program's marker ``echo_line`` are not copied: they set ``echoed``.
    Lines ``hide`` recognises go to the file only.
    """

    def __init__(self, pipe, stream, tag: bytes, copy_path: str | None, lock: threading.Lock,
                 echo_line: bytes | None = None, hide: Callable[[bytes], bool] | None = None,
                 timestamps: bool = False):
        super().__init__(daemon=True)
        self.pipe, self.stream, self.tag, self.lock = pipe, stream, tag, lock
        self.timestamps = timestamps
        self.copy = open(copy_path, "wb") if copy_path else None  # noqa: SIM115 - closed in run()
        self.echo_line = echo_line
        self.hide = hide
        self.echoed = False

    def run(self) -> None:
        try:
            for line in iter(self.pipe.readline, b""):
                if self.echo_line is not None and line.rstrip(b"\n") == self.echo_line:
                    self.echoed = True
                    continue
                if not line.endswith(b"\n"):
                    line += b"\n"  # a final partial line still gets a line of its own
                if self.hide is None or not self.hide(line.rstrip(b"\n")):
                    with self.lock:
                        try:
                            stamp = time.strftime("%a %b %d %H:%M:%S %Y").encode() if self.timestamps else b""
                            self.stream.write(stamp + self.tag + line)
                            self.stream.flush()
                        except (BrokenPipeError, ValueError):
                            pass
                if self.copy:
                    self.copy.write(line)
                    self.copy.flush()
        finally:
            if self.copy:
                self.copy.close()


def main(argv: list[str]) -> int:
    output_dir, quiet_tf_startup, on_rank_zero_too, wait_for_stop, timestamps = None, False, False, False, False
    while argv[:1] in (["--output-dir"], ["--quiet-tf-startup"], ["--quiet-tf-startup-all"], ["--wait-for-stop"],
                       ["--timestamp-output"]):
        if argv[0] == "--wait-for-stop":
            wait_for_stop, argv = True, argv[1:]
        elif argv[0] == "--timestamp-output":
            timestamps, argv = True, argv[1:]
        elif argv[0].startswith("--quiet-tf-startup"):
            quiet_tf_startup, on_rank_zero_too, argv = True, argv[0].endswith("-all"), argv[1:]
        elif len(argv) >= 2:
            output_dir, argv = argv[1], argv[2:]
        else:
            break
    if argv[:1] == ["--"]:
        argv = argv[1:]
    rank = world_rank()
    if not argv:
        sys.stderr.write(f"[{rank}]<stderr>:smdistrun: rank agent got no command\n")
        marker(f"exit {rank} 2 0 0")
        return 2

    stdout_copy = stderr_copy = None
    if output_dir:
        rank_dir = os.path.join(output_dir, f"rank.{rank}")
        os.makedirs(rank_dir, exist_ok=True)
        stdout_copy, stderr_copy = os.path.join(rank_dir, "stdout"), os.path.join(rank_dir, "stderr")

    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # Python ranks: lines appear as they are printed
    marker(f"start {rank} {socket.gethostname()}")
    parent = os.getppid()
    stopped = threading.Event()
    try:
        # A process group of its own: signals reach whatever the program started too.
        child = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=parent_death_signal(signal.SIGKILL),
            process_group=0,
        )
    except OSError as e:
        sys.stderr.write(f"[{rank}]<stderr>:smdistrun: cannot start {argv[0]!r}: {e.strerror}\n")
        sys.stderr.flush()
        marker(f"exit {rank} 127 0 0")
        return 127

    guard = start_group_guard(child.pid)
    try:
        return _relay(child, rank, parent, stopped, stdout_copy, stderr_copy, quiet_tf_startup, on_rank_zero_too,
                      wait_for_stop, timestamps)
    finally:
        os.kill(guard, signal.SIGKILL)
        os.waitpid(guard, 0)


def _relay(child: subprocess.Popen, rank: int, parent: int, stopped: threading.Event, stdout_copy: str | None,
           stderr_copy: str | None, quiet_tf_startup: bool, on_rank_zero_too: bool, wait_for_stop: bool,
           timestamps: bool) -> int:
    """Relays the program's output and signals until it ends; returns the rank's exit code."""

    def signal_program(signum: int) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    def forward(signum, _frame):
        stopped.set()
        signal_program(signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)

    def watch_parent() -> None:
        # mpirun (or its daemon) gone without stopping us: stop the program and what it
        # started, then kill whatever is left.
        while child.poll() is None:
            if os.getppid() != parent:
                stopped.set()
                stop_process_group(child.pid)
                return
            time.sleep(0.5)

    lock_out, lock_err = threading.Lock(), threading.Lock()
    pumps = [
        _Pump(child.stdout, sys.stdout.buffer, f"[{rank}]<stdout>:".encode(), stdout_copy, lock_out,
              timestamps=timestamps),
        _Pump(child.stderr, sys.stderr.buffer, f"[{rank}]<stderr>:".encode(), stderr_copy, lock_err,
              echo_line=f"{MARKER}{os.environ.get(TOKEN_ENV, '')} {ECHO_EVENT}".encode(),
              hide=TensorFlowStartupFilter() if quiet_tf_startup and (rank != 0 or on_rank_zero_too) else None,
              timestamps=timestamps),
    ]
    for pump in pumps:
        pump.start()
    threading.Thread(target=watch_parent, daemon=True).start()
    code = child.wait()
    for pump in pumps:
        pump.join(timeout=5.0)  # a grandchild may hold the pipe open; do not wait forever
    signum = -code if code < 0 else 0
    exit_code = 128 + signum if signum else code
    echoed = pumps[1].echoed
    marker(f"exit {rank} {exit_code} {signum} {int(stopped.is_set() or echoed)}")
    if wait_for_stop and exit_code != 0 and not stopped.is_set():
        hold_until_stopped(stopped, parent)
    return exit_code


def hold_until_stopped(stopped: threading.Event, parent: int) -> None:
    """Waits for a stop signal (or mpirun's end) before a failed rank's agent exits.

    Its exit would make mpirun abort the job and drop the other ranks' output still on its way;
    the launcher stops the job once the others have ended or had a moment to print.
    """
    deadline = time.monotonic() + _FAILED_HOLD_S
    while not stopped.wait(0.1) and os.getppid() == parent and time.monotonic() < deadline:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
