"""``RayExecutor``: a smdist_tf MPI job on Ray actors, spelled as ``horovod.ray.RayExecutor``.

``start()`` reserves one actor per rank in a placement group (``worker.RankWorker``). Each
``run()`` starts ``mpirun`` on the driver with every machine (host name) holding actors as
a host (``smdist-ray-<i>``, its actors' count as slots) and ``rsh_agent.py`` as the remote
agent: each machine's MPI daemon runs inside its first actor, the ranks are that daemon's
children, and rank r talks to the actor of rank r (``rank_entry.py``). The ranks are plain
MPI processes of our engine: no Gloo. mpirun is supervised by the launcher's
``Supervisor``, as under ``smdistrun``; docs/architecture.md says why this design.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import cloudpickle
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from smdist_tf.ray.calls import call_with_executable
from smdist_tf.ray.rank_entry import RANKS_ENV, TOKEN_ENV
from smdist_tf.ray.rsh_agent import DAEMONS_ENV
from smdist_tf.ray.worker import RankWorker
from smdist_tf.run.attempt import QUIET_TF_LOG_LEVEL
from smdist_tf.run.hosts import Host
from smdist_tf.run.mpi_command import MpiJob, build_command, detect_flavour, find_mpirun
from smdist_tf.run.rank_agent import TOKEN_ENV as AGENT_TOKEN_ENV
from smdist_tf.run.session_dir import BASE_VARIABLE, private_session_base
from smdist_tf.run.supervisor import STOP_GRACE_S, Outcome, Supervisor

_HERE = Path(__file__).resolve().parent
_RANK_AGENT = str(_HERE.parent / "run" / "rank_agent.py")
_RSH_AGENT = str(_HERE / "rsh_agent.py")
_RANK_ENTRY = str(_HERE / "rank_entry.py")
# Threads for an actor's methods: hold() blocks while prepare/result/stop_daemons answer.
_ACTOR_THREADS = 4
_NODE_PREFIX = "smdist-ray-"
# After mpirun ended, how long Ray gets to report an actor death that ended the run.
_DEATH_REPORT_S = 2.0
# After a failed run, how long the ranks get to exit (a rank agent whose daemon died stops its rank in ~0.5 s).
_RANK_EXIT_S = 5.0


class RayRunError(RuntimeError):
    """A run failed: a rank raised (its traceback is in the message) or a rank's actor died.

    Attributes:
        failed_rank: the rank that failed first, or whose actor died (None if unknown).
        exit_code: that rank's exit code (None when its actor died).
    """

    def __init__(self, message: str, failed_rank: int | None, exit_code: int | None):
        super().__init__(message)
        self.failed_rank = failed_rank
        self.exit_code = exit_code


@dataclass
class RaySettings:
    """What ``RayExecutor.create_settings`` returns.

    Attributes:
        timeout_s: seconds for every rank of a run to start (mpirun's daemons and the ranks).
        placement_group_timeout_s: seconds to wait for Ray to reserve the actors' resources.
        nics: network interfaces MPI may use (``btl_tcp_if_include``/``oob_tcp_if_include``).
    """

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    nics: Sequence[str] | None = None


class RayExecutor:
    """Runs a function on every rank of a smdist_tf MPI job made of Ray actors.

    Give either ``num_workers`` (ranks packed onto as few nodes as Ray finds room on) or
    ``num_hosts`` and ``num_workers_per_host`` (that many ranks on each of that many
    distinct nodes). Ranks are numbered machine by machine, so ``local_rank()``/``local_size()``
    and the intra-host transports work as under ``smdistrun``.

    Args:
        settings: from :meth:`create_settings`.
        num_workers: number of ranks.
        num_hosts: number of distinct Ray nodes (with ``num_workers_per_host``).
        num_workers_per_host: ranks on each of the ``num_hosts`` nodes.
        cpus_per_worker: CPUs each rank's actor reserves.
        use_gpu: reserve GPUs; each rank then sees only its own (``CUDA_VISIBLE_DEVICES``).
        gpus_per_worker: GPUs per rank when ``use_gpu`` (default 1).
    """

    def __init__(self, settings: RaySettings, num_workers: int | None = None, num_hosts: int | None = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None):
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("RayExecutor: give either num_workers or num_hosts (with num_workers_per_host)")
        count = num_workers if num_workers is not None else num_hosts
        if int(count) < 1 or int(num_workers_per_host) < 1:
            raise ValueError("RayExecutor: num_workers, num_hosts and num_workers_per_host must be at least 1")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("RayExecutor: gpus_per_worker needs use_gpu=True")
        self.settings = settings
        self.num_hosts = num_hosts
        self.num_workers_per_host = int(num_workers_per_host)
        self.num_workers = int(num_workers) if num_workers is not None else int(num_hosts) * self.num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self._token = secrets.token_hex(16)
        self._workers: list[Any] = []  # actor handles in rank order
        self._nodes: list[dict[str, Any]] = []  # describe() of each rank's actor
        self._addresses: list[tuple[str, int]] = []
        self._placement_group = None
        self._executable: tuple[Any, tuple, dict] | None = None
        self._extra_env: dict[str, str] = {}
        self._lost_actor = False  # an actor died: the next run starts new ones
        self._started_at = 0.0

    @staticmethod
    def create_settings(timeout_s: float = 30.0, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                        placement_group_timeout_s: float = 100.0, nics: Sequence[str] | None = None) -> RaySettings:
        """Settings for a ``RayExecutor``, with ``horovod.ray``'s parameters.

        Args:
            timeout_s: seconds for all ranks of a run to start.
            ssh_identity_file: accepted for Horovod compatibility; nothing uses ssh here.
            ssh_str: accepted for Horovod compatibility; nothing uses ssh here.
            placement_group_timeout_s: seconds to wait for the actors' resources.
            nics: network interfaces MPI may use.

        Returns:
            The settings.
        """
        del ssh_identity_file, ssh_str  # the MPI daemons start inside the actors, not over ssh
        return RaySettings(float(timeout_s), float(placement_group_timeout_s), list(nics) if nics else None)

    # ------------------------------------------------------------------ lifetime

    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None, extra_env_vars: dict[str, str] | None = None) -> None:
        """Reserves the resources and starts one actor per rank (no MPI job yet: ``run`` starts one).

        Args:
            executable_cls: a class each rank instantiates for ``execute(fn)``, which calls
                ``fn(instance)``. It is built in the rank process at each ``execute``.
            executable_args: its positional arguments.
            executable_kwargs: its keyword arguments.
            extra_env_vars: variables every rank gets.

        Raises:
            TimeoutError: Ray could not reserve the resources within ``placement_group_timeout_s``.
        """
        if self._workers:
            raise RuntimeError("RayExecutor.start: already started")
        self._started_at = time.time()
        if executable_cls is not None:
            self._executable = (executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {}))
        self._extra_env = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}
        bundle = {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}
        if self.num_hosts is not None:
            per_host = {k: v * self.num_workers_per_host for k, v in bundle.items()}
            group = placement_group([per_host] * self.num_hosts, strategy="STRICT_SPREAD")
        else:
            group = placement_group([bundle] * self.num_workers, strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            remove_placement_group(group)
            raise TimeoutError(f"RayExecutor.start: Ray could not reserve {self.num_workers} x {bundle} within "
                               f"{self.settings.placement_group_timeout_s:g} s")
        self._placement_group = group
        self._start_actors()

    def _start_actors(self) -> None:
        """One actor per rank in the placement group, ordered node by node, each listening."""
        actor_cls = ray.remote(RankWorker)
        workers = []
        for i in range(self.num_workers):
            index = i // self.num_workers_per_host if self.num_hosts is not None else i
            workers.append(actor_cls.options(
                num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker, max_concurrency=_ACTOR_THREADS,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._placement_group,
                                                                     placement_group_bundle_index=index),
            ).remote(self._token, self._started_at))
        nodes = ray.get([w.describe.remote() for w in workers])
        # Ranks machine by machine, as mpirun fills hosts in order: local ranks are then contiguous.
        order = sorted(range(len(workers)), key=lambda i: (nodes[i]["hostname"] != nodes[0]["hostname"],
                                                           nodes[i]["hostname"], i))
        self._workers = [workers[i] for i in order]
        self._nodes = [nodes[i] for i in order]
        self._addresses = [tuple(a) for a in ray.get([w.listen.remote() for w in self._workers])]
        self._lost_actor = False

    def shutdown(self) -> None:
        """Stops any MPI daemon still running, kills the actors and frees the placement group."""
        workers, self._workers = self._workers, []
        if workers:
            stops = [w.stop_daemons.remote() for w in workers]
            ray.wait(stops, num_returns=len(stops), timeout=10)
            for w in workers:
                ray.kill(w)
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None

    # ------------------------------------------------------------------ calls

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
            callbacks: Sequence[Callable[[Any], None]] | None = None) -> list[Any]:
        """Runs ``fn(*args, **kwargs)`` on every rank, in a new MPI job; returns the results in rank order.

        ``fn`` runs in the rank process (a child of the node's MPI daemon inside the node's
        actor), travels there with cloudpickle, and calls ``smdist_tf.init()`` (or
        ``hvd.init()``) itself. Its result must be picklable.

        Args:
            fn: the function.
            args: its positional arguments.
            kwargs: its keyword arguments.
            callbacks: not supported (Horovod's Ray callbacks receive results streamed from
                the workers); must be None.

        Returns:
            ``[result of rank 0, result of rank 1, ...]``.

        Raises:
            RayRunError: a rank raised, exited or was killed, or an actor died; the message
                names the rank (and holds its traceback when it raised).
        """
        if callbacks:
            raise ValueError("RayExecutor.run: callbacks are not supported")
        if not self._workers:
            raise RuntimeError("RayExecutor.run: call start() first")
        return self._run_job(cloudpickle.dumps((fn, tuple(args or ()), dict(kwargs or {}))))

    def execute(self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], None]] | None = None) -> list[Any]:
        """Runs ``fn(executable)`` on every rank, ``executable`` being ``start``'s ``executable_cls``
        instance (None without one); returns the results in rank order.

        Raises:
            RayRunError: as for :meth:`run`.
        """
        return self.run(call_with_executable, args=(fn, self._executable), callbacks=callbacks)

    # ------------------------------------------------------------------ one job

    def _rank_env(self, rank: int) -> dict[str, str]:
        node = self._nodes[rank]
        env = dict(self._extra_env)
        if node["cuda_visible_devices"] is not None:
            env["CUDA_VISIBLE_DEVICES"] = node["cuda_visible_devices"]
        return env

    def _mpi_job(self, mpirun: str, agent_token: str) -> tuple[list[str], dict[str, str]]:
        # One MPI host per machine, even where several Ray nodes share one (ray.cluster_utils.Cluster): ranks
        # under two daemons of one machine would not get Open MPI's shared-memory windows (MPI_ERR_RMA_SHARED).
        machines = list(dict.fromkeys(n["hostname"] for n in self._nodes))
        slots = Counter(n["hostname"] for n in self._nodes)
        hosts = [Host(f"{_NODE_PREFIX}{i}", slots[m]) for i, m in enumerate(machines)]
        first_rank = {m: next(r for r, n in enumerate(self._nodes) if n["hostname"] == m) for m in machines}
        daemons = {f"{_NODE_PREFIX}{i}": self._addresses[first_rank[m]] for i, m in enumerate(machines)}
        flavour = detect_flavour(mpirun)
        if flavour.name != "openmpi" or flavour.major < 5:
            raise RuntimeError(f"RayExecutor needs Open MPI 5 (PRRTE) for its daemon agent; {mpirun} is "
                               f"{flavour.name} {flavour.version}")
        ours = {
            RANKS_ENV: json.dumps(self._addresses), TOKEN_ENV: self._token, AGENT_TOKEN_ENV: agent_token,
            "PYTHONUNBUFFERED": "1", "OMPI_MCA_osc": os.environ.get("OMPI_MCA_osc", "^ucx"),
        }
        if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
            ours["TF_CPP_MIN_LOG_LEVEL"] = QUIET_TF_LOG_LEVEL
        mpi_args = ["--prtemca", "plm_ssh_agent", f"{sys.executable} {_RSH_AGENT}",
                    # Every daemon from the driver: a daemon started by another would need the agent's setup too.
                    "--prtemca", "plm_ssh_no_tree_spawn", "1",
                    "--prefix", str(Path(mpirun).resolve().parent.parent)]
        as_root = os.geteuid() == 0
        job = MpiJob(
            mpirun=mpirun, flavour=flavour, np=self.num_workers,
            rank_command=[sys.executable, _RANK_AGENT, "--wait-for-stop", "--quiet-tf-startup-all", "--",
                          sys.executable, _RANK_ENTRY],
            hosts=hosts, network_interfaces=list(self.settings.nics or []), mpi_args=mpi_args, env=ours,
            # Only our variables: the ranks otherwise keep their actor's environment, as Ray set it up.
            export=[k for k in ours if not k.startswith("OMPI_")] + ["OMPI_MCA_osc"], as_root=as_root,
        )
        env = {**os.environ, **ours, DAEMONS_ENV: json.dumps(daemons)}
        if as_root:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return build_command(job), env

    def _run_job(self, payload: bytes) -> list[Any]:
        if self._lost_actor:
            for w in self._workers:
                ray.kill(w)
            self._start_actors()
        sys_path = [p or os.getcwd() for p in sys.path]
        ray.get([w.prepare.remote({"payload": payload, "env": self._rank_env(r), "sys_path": sys_path})
                 for r, w in enumerate(self._workers)])
        holds = [w.hold.remote() for w in self._workers]
        agent_token = secrets.token_hex(8)
        command, env = self._mpi_job(find_mpirun(os.environ), agent_token)
        dead: dict[int, str] = {}
        with private_session_base(None if BASE_VARIABLE in os.environ else BASE_VARIABLE, env) as job_env:
            supervisor = Supervisor(command, job_env, self.num_workers, agent_token, self.settings.timeout_s,
                                    quiet_exit_banner=True)
            box: list[Outcome] = []
            thread = threading.Thread(target=lambda: box.append(supervisor.run()), daemon=True)
            thread.start()
            try:
                while thread.is_alive():
                    self._note_dead_actors(holds, dead, timeout=0.2)
                    if dead:
                        _stop_mpirun(supervisor)
            finally:  # also on Ctrl-C in the driver: no rank outlives the run
                if thread.is_alive():
                    _stop_mpirun(supervisor)
                thread.join(STOP_GRACE_S)
                if thread.is_alive():  # mpirun did not stop: kill its whole process group
                    _stop_mpirun(supervisor, signal.SIGKILL)
                    thread.join()
                self._lost_actor = bool(dead)
                for r, w in enumerate(self._workers):
                    if r not in dead:
                        w.release.remote()
        outcome = box[0]
        if outcome.exit_code != 0:
            self._note_dead_actors(holds, dead, timeout=_DEATH_REPORT_S)
            self._lost_actor = bool(dead)
            alive = [w for r, w in enumerate(self._workers) if r not in dead]
            # Ranks whose daemon died end through their rank agents (parent gone): run() returns once they have.
            ray.get([w.wait_for_rank_exit.remote(_RANK_EXIT_S) for w in alive])
            # A daemon that died could not delete its ranks' shared-memory files.
            ray.get([w.stop_daemons.remote() for w in alive])
        if dead:
            rank = min(dead)
            node = self._nodes[rank]
            raise RayRunError(f"RayExecutor: the Ray actor of rank {rank} (node {node['node_id'][:12]}, host "
                              f"{node['hostname']}) died: {dead[rank]}; every rank was stopped", rank, None)
        replies = ray.get([w.result.remote() for w in self._workers])
        if outcome.exit_code != 0:
            raise self._failure(outcome, replies)
        missing = [r for r, reply in enumerate(replies) if reply is None or reply[0] != "ok"]
        if missing:
            raise RayRunError(f"RayExecutor: rank {missing[0]} sent no result", missing[0], 0)
        return [cloudpickle.loads(reply[1]) for reply in replies]

    def _note_dead_actors(self, holds: list[Any], dead: dict[int, str], timeout: float) -> None:
        """Records in ``dead`` the ranks whose actor died (their ``hold`` failed)."""
        pending = [h for r, h in enumerate(holds) if r not in dead]
        finished, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout) if pending else ([], [])
        for ref in finished:
            rank = holds.index(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                dead[rank] = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__

    def _failure(self, outcome: Outcome, replies: list[tuple | None]) -> RayRunError:
        failed = outcome.failed_rank
        if failed is None:
            return RayRunError(f"RayExecutor: the MPI job failed ({outcome.reason or 'mpirun exited non-zero'})",
                               None, outcome.exit_code)
        reply = replies[failed.rank]
        if reply is not None and reply[0] == "error" and reply[2] >= 0 and reply[2] in outcome.exits:
            # That rank's engine names the rank that failed first: the first to exit was only an echo.
            failed = outcome.exits[reply[2]]
            reply = replies[failed.rank]
        host = self._nodes[failed.rank]["hostname"]
        detail = f":\n{reply[1]}" if reply is not None and reply[0] == "error" else ""
        return RayRunError(f"RayExecutor: {failed.describe(host)}; the other ranks were stopped{detail}",
                           failed.rank, failed.code)


def _stop_mpirun(supervisor: Supervisor, signum: int = signal.SIGTERM) -> None:
    """SIGTERM to mpirun, which stops the daemons and ranks; SIGKILL to its process group as a last resort."""
    proc = supervisor.proc
    if proc is None or proc.poll() is not None:
        return
    try:
        if signum == signal.SIGKILL:
            os.killpg(proc.pid, signum)  # the Supervisor starts mpirun in a session of its own
        else:
            proc.send_signal(signum)
    except ProcessLookupError:
        pass
