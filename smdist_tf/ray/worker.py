"""The Ray actor behind each rank of a ``RayExecutor``: :class:`RankWorker`.

An actor holds its rank's resources (CPUs, a GPU) on its Ray node and serves, on one
authenticated socket (``multiprocessing.connection``, HMAC with the executor's token):

* ``("daemon", command)`` from ``rsh_agent.py``: runs its machine's MPI daemon (``prted``),
  the command mpirun would have run over ssh, as a child of this actor, and answers its
  exit code. The daemon dies with the actor (parent-death signal) and with the agent's
  connection (as an ssh session's command dies with the session).
* ``("rank", rank)`` from ``rank_entry.py``: hands the rank its call (``fn`` and its
  arguments, cloudpickled) and the environment that belongs to this actor
  (``CUDA_VISIBLE_DEVICES`` of its GPU, the node's host identity), then keeps the result
  the rank sends back. The rank keeps the connection open: when this actor dies, the
  rank sees it close and stops.

Threads: Ray runs the actor's methods on a pool (``max_concurrency``), so ``hold`` can
block while the other methods answer.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from multiprocessing.connection import Connection, Listener
from typing import Any

from smdist_tf.ray.shm_sweep import sweep_segments
from smdist_tf.run.rank_agent import parent_death_signal

# How often a daemon's handler checks whether the daemon or the agent's connection ended.
_POLL_S = 0.1
_KILL_GRACE_S = 2.0


def node_address() -> str:
    """The address other nodes reach this one on: Ray's node IP, else the host name's."""
    import ray  # noqa: PLC0415 - only inside an actor, where Ray is running

    return ray.util.get_node_ip_address() or socket.gethostbyname(socket.gethostname())


class RankWorker:
    """One rank's Ray actor (see the module docstring). Made a Ray actor by the executor."""

    def __init__(self, token: str, started_at: float):
        self._token = token.encode()
        self._started_at = started_at  # the executor's start: its jobs' files are no older
        self._listener: Listener | None = None
        self._lock = threading.Lock()
        self._call: dict[str, Any] | None = None  # what the next rank connection gets
        self._result: tuple | None = None  # ("ok", bytes) or ("error", traceback, failed peer): rank_entry.py
        self._daemons: list[subprocess.Popen] = []
        self._released = threading.Event()
        self._rank_connections = 0  # open connections of rank processes: each closes when its rank exits
        self._ranks_changed = threading.Condition(self._lock)

    def describe(self) -> dict[str, Any]:
        """Where this actor runs: node id, host name, address, pid, and its GPU devices."""
        import ray  # noqa: PLC0415

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(), "hostname": socket.gethostname(), "address": node_address(),
            "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def listen(self) -> tuple[str, int]:
        """Opens this actor's socket (once) and returns its address."""
        if self._listener is None:
            self._listener = Listener((node_address(), 0), authkey=self._token)
            threading.Thread(target=self._accept_forever, daemon=True).start()
        host, port = self._listener.address
        return host, port

    def prepare(self, call: dict[str, Any]) -> None:
        """Sets what the rank of the next run gets: ``{"payload": bytes, "env": {...}, "sys_path": [...]}``."""
        with self._lock:
            self._call, self._result = call, None
            self._released.clear()

    def hold(self) -> None:
        """Returns when ``release()`` is called: while it is pending, its failure says this actor died."""
        self._released.wait()

    def release(self) -> None:
        """Ends the pending ``hold()``."""
        self._released.set()

    def result(self) -> tuple | None:
        """What the rank of the last run sent (see rank_entry.py), or None."""
        with self._lock:
            return self._result

    def wait_for_rank_exit(self, timeout: float) -> bool:
        """Waits until no rank process is connected (each closes its connection as it exits); False on timeout."""
        with self._ranks_changed:
            return self._ranks_changed.wait_for(lambda: self._rank_connections == 0, timeout)

    def stop_daemons(self) -> list[str]:
        """Kills the MPI daemons this actor still runs (their ranks with them), then removes the
        shared-memory files that the executor's dead jobs left on this node; returns their paths."""
        with self._lock:
            daemons, self._daemons = self._daemons, []
        for daemon in daemons:
            _stop(daemon)
        return sweep_segments(self._started_at)

    # ------------------------------------------------------------------ the socket

    def _accept_forever(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):  # a peer that failed authentication, or the listener closed
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        try:
            request = conn.recv()
            if request[0] == "daemon":
                self._run_daemon(conn, request[1])
            elif request[0] == "rank":
                self._serve_rank(conn)
        except (EOFError, OSError):
            pass
        finally:
            conn.close()

    def _run_daemon(self, conn: Connection, command: str) -> None:
        # A login shell would run mpirun's remote command; sh -c does what sshd does with it.
        # Started from this thread, which waits for it: the parent-death signal is tied to the
        # thread, and to the actor's death.
        daemon = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                  preexec_fn=parent_death_signal(signal.SIGKILL), process_group=0)
        with self._lock:
            self._daemons.append(daemon)
        try:
            while daemon.poll() is None:
                if conn.poll(_POLL_S):  # the agent never writes: readable means it closed
                    conn.recv()
        except (EOFError, OSError):
            pass  # mpirun stopped its agent: the daemon goes as with a closed ssh session
        finally:
            _stop(daemon)
            with self._lock:
                if daemon in self._daemons:
                    self._daemons.remove(daemon)
        try:
            conn.send(daemon.returncode)
        except OSError:
            pass

    def _serve_rank(self, conn: Connection) -> None:
        with self._lock:
            call = self._call
            self._rank_connections += 1
        try:
            if call is None:
                conn.send(None)
                return
            conn.send(call)
            reply = conn.recv()  # EOF if the rank died first
            with self._lock:
                if self._call is call:
                    self._result = reply
            try:
                conn.recv()  # the rank closes its end when it exits
            except (EOFError, OSError):
                pass
        finally:
            with self._ranks_changed:
                self._rank_connections -= 1
                self._ranks_changed.notify_all()


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group, then SIGKILL after a grace period."""
    for signum, wait in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    # The daemon's group is gone; its ranks made process groups of their own (rank_agent.py)
    # and die with their agent, which dies with the daemon (parent-death signal).
