"""Fills hosts and slots from the cluster manager's environment when ``-H`` is not given.

SageMaker training jobs describe the cluster with ``SM_HOSTS`` (a JSON list),
``SM_CURRENT_HOST`` and ``SM_NUM_GPUS`` / ``SM_NUM_CPUS``. The Kubeflow MPI
Operator mounts a hostfile into the launcher pod and names it in the variable
its MPI reads (``OMPI_MCA_orte_default_hostfile`` for Open MPI). Slurm allocations
describe it with ``SLURM_JOB_NODELIST`` (compressed as ``node[01-04,07]``), the
per-node task counts in ``SLURM_NTASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE``, and
``SLURM_GPUS_PER_NODE``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping

from smdist_tf.run.errors import UsageError
from smdist_tf.run.hosts import Host, check_host_name, parse_hostfile

# The MPI Operator's launcher pod: where the hostfile is mounted, and the variables that
# name it for each MPI it supports (Open MPI 4 and PRRTE's, Intel MPI's, MPICH's).
MPI_OPERATOR_HOSTFILE = "/etc/mpi/hostfile"
HOSTFILE_VARIABLES = ("OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile",
                      "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE")


@dataclass(frozen=True)
class ClusterInfo:
    """What a cluster manager told us about the job's machines."""

    kind: str  # "sagemaker", "kubernetes", "hostfile" or "slurm"
    hosts: list[Host]
    current_host: str | None = None

    @property
    def leader(self) -> str:
        """The host that starts mpirun: the first listed (SageMaker's algo-1, Slurm's first node)."""
        return self.hosts[0].name

    @property
    def is_leader(self) -> bool:
        return self.current_host is None or self.current_host == self.leader


def _positive_int(text: str | None) -> int | None:
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def detect_sagemaker(env: Mapping[str, str]) -> ClusterInfo | None:
    """Reads SageMaker's variables; None when ``SM_HOSTS`` is not set.

    Slots per host: ``SM_NUM_GPUS`` when positive (one rank per GPU), otherwise
    ``SM_NUM_CPUS``, otherwise this machine's core count (SageMaker clusters are homogeneous).

    Raises:
        UsageError: when ``SM_HOSTS`` is not a JSON list of valid host names.
    """
    raw = env.get("SM_HOSTS")
    if not raw:
        return None
    try:
        names = json.loads(raw)
    except json.JSONDecodeError:
        raise UsageError(f"SM_HOSTS is not a JSON list: {raw!r}") from None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise UsageError(f"SM_HOSTS is not a non-empty JSON list of host names: {raw!r}")
    slots = (
        _positive_int(env.get("SM_NUM_GPUS"))
        or _positive_int(env.get("SM_NUM_CPUS"))
        or os.cpu_count()
        or 1
    )
    # SageMaker names hosts algo-1, algo-2, ...; sorting keeps algo-1 the leader.
    hosts = [Host(check_host_name(n, "SM_HOSTS"), slots) for n in sorted(names)]
    return ClusterInfo("sagemaker", hosts, env.get("SM_CURRENT_HOST"))


def expand_nodelist(nodelist: str) -> list[str]:
    """Expands Slurm's compressed host list: ``n[1-3,07],gpu-a[01-02]-ib`` → individual names.

    Zero padding of range bounds is kept (``n[08-10]`` → n08, n09, n10). Several bracket
    groups in one name expand to every combination, as Slurm does.

    Raises:
        UsageError: on unbalanced brackets or a bad range.
    """
    # Split on commas that are not inside brackets.
    items, depth, current = [], 0, ""
    for ch in nodelist.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"bad SLURM_JOB_NODELIST {nodelist!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    if depth != 0:
        raise UsageError(f"bad SLURM_JOB_NODELIST {nodelist!r}: unbalanced '['")
    items.append(current)

    names: list[str] = []
    for item in items:
        if item:
            names.extend(_expand_one(item, nodelist))
    return names


def _expand_one(item: str, whole: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if not match:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    expanded = []
    for part in match.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise UsageError(f"bad range {part!r} in SLURM_JOB_NODELIST {whole!r}")
        width = len(lo)
        for n in range(int(lo), int(hi if sep else lo) + 1):
            expanded.append(f"{head}{n:0{width}d}")
    # Later bracket groups multiply out with this one.
    return [name + rest for name in expanded for rest in _expand_one(tail, whole)]


def expand_tasks_per_node(spec: str, count: int) -> list[int]:
    """Expands ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) to one count per node."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise UsageError(f"bad SLURM_TASKS_PER_NODE {spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    if len(counts) != count:
        raise UsageError(f"SLURM_TASKS_PER_NODE {spec!r} gives {len(counts)} nodes, the node list has {count}")
    return counts


def gpus_per_node(env: Mapping[str, str]) -> int | None:
    """GPUs Slurm gave each node: ``SLURM_GPUS_PER_NODE`` (``4``, ``a100:4``, ``a100:2,v100:2``),
    else ``SLURM_GPUS_ON_NODE`` (``--gres=gpu:4``); None when the job asked for none.

    Raises:
        UsageError: on a value that is not such a count.
    """
    spec = env.get("SLURM_GPUS_PER_NODE")
    if spec:
        total = 0
        for part in spec.split(","):
            match = re.fullmatch(r"\s*(?:[\w.-]+:)?(\d+)\s*", part)
            if not match:
                raise UsageError(f"bad SLURM_GPUS_PER_NODE {spec!r}: expected [type:]count[,...]")
            total += int(match.group(1))
        return total or None
    return _positive_int(env.get("SLURM_GPUS_ON_NODE"))


def detect_slurm(env: Mapping[str, str]) -> ClusterInfo | None:
    """Reads Slurm's variables; None outside a Slurm allocation.

    Slots per node, first found: ``SLURM_NTASKS_PER_NODE`` (``--ntasks-per-node``, uniform);
    with ``SLURM_NTASKS`` (``-n``), Slurm's split of those tasks, ``SLURM_TASKS_PER_NODE``
    (``2(x3),1``), else ``SLURM_NTASKS`` spread evenly; one rank per GPU when the job asked for
    GPUs per node (``--gpus-per-node``, ``--gres=gpu:N``) and no task count; then
    ``SLURM_TASKS_PER_NODE``; else ``SLURM_CPUS_ON_NODE``; else one.

    Raises:
        UsageError: on a malformed node list, task or GPU count, or a node name that is not a host name.
    """
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    names = [check_host_name(n, f"SLURM_JOB_NODELIST {nodelist!r}") for n in expand_nodelist(nodelist)]
    if not names:
        raise UsageError(f"SLURM_JOB_NODELIST {nodelist!r} names no nodes")
    per_node = _positive_int(env.get("SLURM_NTASKS_PER_NODE"))
    ntasks = _positive_int(env.get("SLURM_NTASKS"))
    # Without -n or --ntasks-per-node, Slurm still says one task per node: a GPU job
    # asked for its GPUs instead, and wants a rank on each.
    gpus = None if per_node or ntasks else gpus_per_node(env)
    if per_node:
        slots = [per_node] * len(names)
    elif ntasks and env.get("SLURM_TASKS_PER_NODE"):
        slots = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"], len(names))
    elif ntasks:
        base, extra = divmod(ntasks, len(names))
        slots = [base + (1 if i < extra else 0) for i in range(len(names))]
    elif gpus:
        slots = [gpus] * len(names)
    elif env.get("SLURM_TASKS_PER_NODE"):
        slots = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"], len(names))
    else:
        slots = [_positive_int(env.get("SLURM_CPUS_ON_NODE")) or 1] * len(names)
    hosts = [Host(n, s) for n, s in zip(names, slots) if s > 0]
    return ClusterInfo("slurm", hosts, env.get("SLURMD_NODENAME"))


def detect_mpi_hostfile(env: Mapping[str, str]) -> ClusterInfo | None:
    """Reads the hostfile the environment names for mpirun; None when none is named.

    The Kubeflow MPI Operator's launcher pod has ``K_MPI_JOB_ROLE=launcher`` and the
    hostfile (``name slots=N`` for Open MPI, ``name:N`` for Intel MPI and MPICH) at
    ``/etc/mpi/hostfile``, named by ``OMPI_MCA_orte_default_hostfile`` (Open MPI),
    ``I_MPI_HYDRA_HOST_FILE`` or ``HYDRA_HOST_FILE``. The same variables set anywhere
    else are read too: mpirun itself would use that file.

    Raises:
        UsageError: when the named file cannot be read or is not a hostfile.
    """
    for name in HOSTFILE_VARIABLES:
        if env.get(name):
            kind = "kubernetes" if env.get("K_MPI_JOB_ROLE") == "launcher" else "hostfile"
            return ClusterInfo(kind, parse_hostfile(env[name]))
    if env.get("K_MPI_JOB_ROLE") == "launcher" and os.path.isfile(MPI_OPERATOR_HOSTFILE):
        return ClusterInfo("kubernetes", parse_hostfile(MPI_OPERATOR_HOSTFILE))
    return None


def detect(env: Mapping[str, str]) -> ClusterInfo | None:
    """SageMaker first (its containers may run under other schedulers), then a hostfile named
    for mpirun (the MPI Operator's), then Slurm."""
    return detect_sagemaker(env) or detect_mpi_hostfile(env) or detect_slurm(env)
