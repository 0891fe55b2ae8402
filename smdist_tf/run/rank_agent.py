"""Runs one rank's command under mpirun (started by path, standard library only).

Between mpirun and the user's program it:

* prefixes every line the program writes with its rank (``[1]<stdout>:...``), the same
  way for every MPI, and optionally copies the untagged output to
  ``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr`` on the host where the rank runs;
* tells the launcher when the rank started and how it ended, with marker lines on
  stderr that carry the launch's token (the launcher removes them from the output),
  so the launcher can name the rank that failed first and enforce ``--start-timeout``;
* forwards termination signals to the program, and kills it if mpirun or its daemon
  disappears, so no rank outlives the job.

Started as ``python rank_agent.py [--output-dir DIR] -- command ...``; running it by
path keeps each rank's start cheap (no package import, no TensorFlow).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

MARKER = "@smdistrun@"
TOKEN_ENV = "SMDISTRUN_TOKEN"
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_KILL_GRACE_S = 3.0


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


def _set_parent_death_signal() -> None:
    # Linux: the program gets SIGKILL if this agent dies, even by SIGKILL.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort outside Linux
        pass


class _Pump(threading.Thread):
    """Copies one pipe to our stream, a tag before each line, and optionally to a file."""

    def __init__(self, pipe, stream, tag: bytes, copy_path: str | None, lock: threading.Lock):
        super().__init__(daemon=True)
        self.pipe, self.stream, self.tag, self.lock = pipe, stream, tag, lock
        self.copy = open(copy_path, "wb") if copy_path else None  # noqa: SIM115 - closed in run()

    def run(self) -> None:
        try:
            for line in iter(self.pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"  # a final partial line still gets a line of its own
                with self.lock:
                    try:
                        self.stream.write(self.tag + line)
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
    output_dir = None
    if argv[:1] == ["--output-dir"] and len(argv) >= 2:
        output_dir, argv = argv[1], argv[2:]
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
        child = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_set_parent_death_signal
        )
    except OSError as e:
        sys.stderr.write(f"[{rank}]<stderr>:smdistrun: cannot start {argv[0]!r}: {e.strerror}\n")
        sys.stderr.flush()
        marker(f"exit {rank} 127 0 0")
        return 127

    def forward(signum, _frame):
        stopped.set()
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)

    def watch_parent() -> None:
        # mpirun (or its daemon) gone without stopping us: stop the program, then kill it.
        while child.poll() is None:
            if os.getppid() != parent:
                stopped.set()
                child.terminate()
                deadline = time.monotonic() + _KILL_GRACE_S
                while child.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                if child.poll() is None:
                    child.kill()
                return
            time.sleep(0.5)

    lock_out, lock_err = threading.Lock(), threading.Lock()
    pumps = [
        _Pump(child.stdout, sys.stdout.buffer, f"[{rank}]<stdout>:".encode(), stdout_copy, lock_out),
        _Pump(child.stderr, sys.stderr.buffer, f"[{rank}]<stderr>:".encode(), stderr_copy, lock_err),
    ]
    for pump in pumps:
        pump.start()
    threading.Thread(target=watch_parent, daemon=True).start()
    code = child.wait()
    for pump in pumps:
        pump.join(timeout=5.0)  # a grandchild may hold the pipe open; do not wait forever
    signum = -code if code < 0 else 0
    exit_code = 128 + signum if signum else code
    marker(f"exit {rank} {exit_code} {signum} {int(stopped.is_set())}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
