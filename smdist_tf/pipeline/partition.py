"""Splitting a model's ordered layer calls into contiguous, non-empty pipeline stages."""

from __future__ import annotations

from typing import Sequence, Union

PartitionSpec = Union[str, Sequence[int], Sequence[str]]


def balanced_split(costs: Sequence[int], num_stages: int) -> list[int]:
    """Stage sizes of the contiguous split that minimises the largest stage cost.

    Ties are broken by the largest stage length, so layers without parameters
    still spread out. Dynamic programming, O(n² · stages): fine for model depths.
    """
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = (float("inf"), float("inf"))
    # best[k][i]: cost of splitting the first i units into k stages; choice[k][i]: start of stage k.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    choice = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = (0, 0)
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                if best[k - 1][j] == inf:
                    continue
                cand = max(best[k - 1][j], (prefix[i] - prefix[j], i - j))
                if cand < best[k][i]:
                    best[k][i], choice[k][i] = cand, j
    sizes, i = [], n
    for k in range(num_stages, 0, -1):
        j = choice[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def resolve(partition: PartitionSpec, unit_names: Sequence[str], unit_params: Sequence[int], num_stages: int) -> list[int]:
    """Turns a ``partition`` argument into stage sizes (numbers of layer calls per stage).

    Args:
        partition: ``'auto'`` (balance trainable parameters), ``'uniform'`` (balance layer
            count), a list of stage sizes, or a list of layer names where stages begin.
        unit_names: layer name of every layer call, in execution order.
        unit_params: trainable parameters of every layer call.
        num_stages: number of pipeline stages.

    Raises:
        ValueError: the partition cannot give every stage at least one layer.
    """
    n = len(unit_names)
    if num_stages > n:
        raise ValueError(f"num_stages={num_stages} is more than the model's {n} layers: every stage needs at least one layer")
    if isinstance(partition, str):
        if partition == "auto":
            return balanced_split(unit_params, num_stages)
        if partition == "uniform":
            return [n // num_stages + (1 if s < n % num_stages else 0) for s in range(num_stages)]
        raise ValueError(f"unknown partition {partition!r}: use 'auto', 'uniform', a list of stage sizes or of layer names")
    items = list(partition)
    if len(items) != num_stages:
        raise ValueError(f"partition lists {len(items)} stages but num_stages={num_stages}")
    if all(isinstance(x, int) for x in items):
        if any(x < 1 for x in items) or sum(items) != n:
            raise ValueError(f"partition sizes {items} must be positive and add up to the model's {n} layers")
        return items
    if all(isinstance(x, str) for x in items):
        starts = []
        for name in items:
            if name not in unit_names:
                raise ValueError(f"partition names layer {name!r}, which the model does not have")
            starts.append(list(unit_names).index(name))
        if starts[0] != 0:
            raise ValueError(f"the first stage must begin at the first layer {unit_names[0]!r}, not {items[0]!r}")
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"partition layer names {items} are not in increasing execution order")
        return [b - a for a, b in zip(starts, starts[1:] + [n])]
    raise ValueError("partition must be 'auto', 'uniform', a list of ints or a list of layer names")
