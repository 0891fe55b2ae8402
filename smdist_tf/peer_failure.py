"""A rank whose collectives failed because another rank failed says so, briefly.

When a rank exits with an error, its engine tells the others why before it goes
("rank 1 is exiting with code 3"), and their pending collectives fail with that
message. Those ranks then exit with errors of their own, which are only echoes:
full tracebacks from every rank would bury the one that matters, and a launcher
could name the wrong rank as the cause. So once the engine names a failed peer:

* an unhandled error that carries the engine's stop message prints one line
  (this rank, where it was, why) instead of a traceback;
* at exit the rank tells smdistrun's rank agent, with a marker line on stderr,
  that its failure is not the cause.
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from types import TracebackType

from smdist_tf._native import runtime as _rt
from smdist_tf.run.rank_agent import ECHO_EVENT, MARKER, TOKEN_ENV

# The end of every error message the engine stops with after a peer's failure.
STOP_MESSAGE = "smdist_tf stopped on every rank"
_installed = False


def _is_echo(exc: BaseException) -> bool:
    return _rt.failed_peer() >= 0 and STOP_MESSAGE in str(exc)


def _where(tb: TracebackType | None) -> str:
    """The innermost frame of the user's code (not TensorFlow's or ours), as file:line."""
    frames = traceback.extract_tb(tb)
    package = os.path.dirname(os.path.abspath(__file__))
    user = [f for f in frames
            if not f.filename.startswith((package, "<")) and "site-packages" not in f.filename]
    frame = (user or frames or [None])[-1]
    return f"{frame.filename}:{frame.lineno}" if frame else "?"


def _excepthook(previous):
    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not _is_echo(exc):
            previous(exc_type, exc, tb)
            return
        reason = next((line for line in str(exc).splitlines() if STOP_MESSAGE in line), STOP_MESSAGE)
        reason = reason.split("}} ", 1)[-1].split(" [Op:", 1)[0]  # TensorFlow's decorations
        sys.stderr.write(f"[smdist_tf rank {_rt.rank()}] {exc_type.__name__} at {_where(tb)}: {reason}\n")
        sys.stderr.flush()

    return hook


def _tell_launcher() -> None:
    token = os.environ.get(TOKEN_ENV)
    if token is not None and _rt.failed_peer() >= 0:
        os.write(2, f"{MARKER}{token} {ECHO_EVENT}\n".encode())


def install() -> None:
    """Installs the exception hook and the exit report (once per process)."""
    global _installed
    if _installed:
        return
    sys.excepthook = _excepthook(sys.excepthook)
    atexit.register(_tell_launcher)
    _installed = True
