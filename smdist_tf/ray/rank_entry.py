"""One rank of a ``RayExecutor`` run (started by path under mpirun; standard library and cloudpickle).

The rank connects to its own Ray actor (``SMDIST_RAY_RANKS``: JSON list of [address, port]
by rank; the actor of rank r runs on the machine mpirun put rank r on), takes the call and
the variables that are this rank's (its actor's GPUs, ``start``'s ``extra_env_vars``), runs
``fn`` and sends back ``("ok", cloudpickled result)`` or ``("error", traceback, failed peer)``,
the failed peer being the rank the engine says failed first (-1: none; then this failure is
the cause). If the actor dies while ``fn`` runs, the connection closes and the rank kills
itself, so the engine ends the job on every rank.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Client

RANKS_ENV = "SMDIST_RAY_RANKS"
TOKEN_ENV = "SMDIST_RAY_TOKEN"


def _rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _die_with_the_actor(conn, finished: threading.Event) -> None:
    try:
        conn.recv()  # the actor never writes again: this returns only when it closes
    except (EOFError, OSError):
        pass
    if not finished.is_set():
        sys.stderr.write(f"smdist_tf.ray: rank {_rank()} lost its Ray actor; stopping\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _failed_peer() -> int:
    """The rank whose failure the engine reported to this one, or -1 (also when fn never started it)."""
    runtime = sys.modules.get("smdist_tf._runtime")
    try:
        return int(runtime.failed_peer()) if runtime is not None else -1
    except Exception:  # noqa: BLE001 - an engine that never started knows of no peer
        return -1


def main() -> int:
    rank = _rank()
    address = json.loads(os.environ[RANKS_ENV])[rank]
    conn = Client(tuple(address), authkey=os.environ[TOKEN_ENV].encode())
    conn.send(("rank", rank))
    call = conn.recv()
    if call is None:
        sys.stderr.write(f"smdist_tf.ray: the actor of rank {rank} has no call to run\n")
        return 1
    os.environ.update(call["env"])
    for entry in reversed(call["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    finished = threading.Event()
    threading.Thread(target=_die_with_the_actor, args=(conn, finished), daemon=True).start()

    import cloudpickle  # noqa: PLC0415 - after sys.path is set: fn's modules load from there

    try:
        fn, args, kwargs = cloudpickle.loads(call["payload"])
        reply = ("ok", cloudpickle.dumps(fn(*args, **kwargs)))
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the driver, SystemExit too
        reply = ("error", traceback.format_exc(), _failed_peer())
        code = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) and e.code else 1
        if not isinstance(e, SystemExit):
            # smdist_tf's hook shortens a failure that only echoes another rank's and says so to the agent.
            sys.excepthook(*sys.exc_info())
    finished.set()
    conn.send(reply)
    conn.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
