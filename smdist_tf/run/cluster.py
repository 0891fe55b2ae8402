"""Fills hosts and slots from the cluster manager's environment when ``-H`` is not given.

SageMaker training jobs describe the cluster with ``SM_HOSTS`` (a JSON list),
``SM_CURRENT_HOST`` and ``SM_NUM_GPUS`` / ``SM_NUM_CPUS``. Slurm allocations
describe it with ``SLURM_JOB_NODELIST`` (compressed as ``node[01-04,07]``) and
the per-node task counts in ``SLURM_NTASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping

from smdist_tf.run.errors import UsageError
from smdist_tf.run.hosts import Host, check_host_name


@dataclass(frozen=True)
class ClusterInfo:
    """What a cluster manager told us about the job's machines."""

    kind: str  # "sagemaker" or "slurm"
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


def detect_slurm(env: Mapping[str, str]) -> ClusterInfo | None:
    """Reads Slurm's variables; None outside a Slurm allocation.

    Slots per node, first found: ``SLURM_NTASKS_PER_NODE`` (uniform),
    ``SLURM_TASKS_PER_NODE`` (per node), ``SLURM_NTASKS`` spread evenly,
    ``SLURM_CPUS_ON_NODE``, else one.

    Raises:
        UsageError: on a malformed node list or task count, or a node name that is not a host name.
    """
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    names = [check_host_name(n, f"SLURM_JOB_NODELIST {nodelist!r}") for n in expand_nodelist(nodelist)]
    if not names:
        raise UsageError(f"SLURM_JOB_NODELIST {nodelist!r} names no nodes")
    per_node = _positive_int(env.get("SLURM_NTASKS_PER_NODE"))
    if per_node:
        slots = [per_node] * len(names)
    elif env.get("SLURM_TASKS_PER_NODE"):
        slots = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"], len(names))
    elif _positive_int(env.get("SLURM_NTASKS")):
        total = _positive_int(env.get("SLURM_NTASKS")) or 1
        base, extra = divmod(total, len(names))
        slots = [base + (1 if i < extra else 0) for i in range(len(names))]
    else:
        slots = [_positive_int(env.get("SLURM_CPUS_ON_NODE")) or 1] * len(names)
    hosts = [Host(n, s) for n, s in zip(names, slots) if s > 0]
    return ClusterInfo("slurm", hosts, env.get("SLURMD_NODENAME"))


def detect(env: Mapping[str, str]) -> ClusterInfo | None:
    """SageMaker first (its containers may run under other schedulers), then Slurm."""
    return detect_sagemaker(env) or detect_slurm(env)
