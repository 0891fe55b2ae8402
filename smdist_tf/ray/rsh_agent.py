"""mpirun's remote agent for a ``RayExecutor`` job, in place of ssh (started by path, standard library only).

Open MPI calls it as ``rsh_agent.py HOST COMMAND...`` to start its daemon on HOST. HOST is
one of the names the executor gave mpirun (``smdist-ray-<machine index>``); the agent finds
that machine's first actor in ``SMDIST_RAY_DAEMONS`` (JSON: name -> [address, port]) and asks
it to run COMMAND (``worker.RankWorker``), then waits, as ssh would, and exits with the
daemon's exit code. When mpirun stops the agent, the actor stops the daemon.
"""

from __future__ import annotations

import json
import os
import sys
from multiprocessing.connection import Client

DAEMONS_ENV = "SMDIST_RAY_DAEMONS"
TOKEN_ENV = "SMDIST_RAY_TOKEN"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("smdist_tf.ray agent: usage: rsh_agent.py HOST COMMAND...\n")
        return 255
    host, command = argv[0], " ".join(argv[1:])
    address = json.loads(os.environ.get(DAEMONS_ENV, "{}")).get(host)
    if address is None:
        sys.stderr.write(f"smdist_tf.ray agent: no Ray actor for host {host!r}\n")
        return 255
    try:
        with Client(tuple(address), authkey=os.environ[TOKEN_ENV].encode()) as conn:
            conn.send(("daemon", command))
            return int(conn.recv())
    except (OSError, EOFError) as e:
        sys.stderr.write(f"smdist_tf.ray agent: lost the Ray actor of {host} ({e.__class__.__name__}: {e})\n")
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
