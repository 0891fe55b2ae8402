"""Sums or broadcasts variables within groups of ranks, using only two world ``alltoall`` calls.

A pipeline variable is held by a *group* of ranks: the data-parallel replicas of every
stage that uses it (more than one stage for tied weights). Gradients must be summed,
and initial values copied, within each group. The engine has no process sets, so a
world allreduce would need every rank to contribute a buffer the size of the *whole*
model; that is exactly the memory a pipeline stage must not spend. Instead each group
buffer is cut into one chunk per member and moved with ``alltoall`` (every rank calls
it; ranks outside a group send and receive nothing for it):

1. scatter: member ``j`` gets chunk ``j`` of every other member's buffer (reduce) or of
   the first member's buffer (broadcast), and reduces it in member order;
2. gather: every member gets every other member's finished chunk.

Each rank sends and receives ``2 (n − 1) / n`` of its own buffer (as a ring allreduce
would). Buffers move in rounds of at most ``bucket_bytes`` per group, so besides the
values themselves an exchange holds a few buckets. A chunk is finished by one rank and
copied to the others, so all members end bit-identical. Everything travels as bytes,
so one call moves every dtype.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

import smdist_tf as sd


def to_bytes(value: tf.Tensor) -> tf.Tensor:
    """A tensor as a flat uint8 tensor (no copy where TensorFlow can avoid one)."""
    value = tf.reshape(tf.convert_to_tensor(value), [-1])
    if value.dtype == tf.bool:
        return tf.cast(value, tf.uint8)
    if value.dtype.size == 1:
        return tf.bitcast(value, tf.uint8)
    return tf.reshape(tf.bitcast(value, tf.uint8), [-1])


def from_bytes(data: tf.Tensor, dtype: tf.DType, shape: Sequence[int]) -> tf.Tensor:
    """Inverse of :func:`to_bytes`."""
    dtype = tf.as_dtype(dtype)
    if dtype == tf.bool:
        flat = tf.cast(data, tf.bool)
    elif dtype.size == 1:
        flat = tf.bitcast(data, dtype)
    else:
        flat = tf.bitcast(tf.reshape(data, [-1, dtype.size]), dtype)
    return tf.reshape(flat, shape)


@dataclasses.dataclass
class _Group:
    members: tuple  # ranks, ascending
    dtype: tf.DType
    slots: list = dataclasses.field(default_factory=list)  # (local index, shape, offset, size), in global order
    size: int = 0  # elements
    step: int = 1  # elements per round


def _round_step(dtype: tf.DType, bucket_bytes: int) -> int:
    return max(1, bucket_bytes // tf.as_dtype(dtype).size)


class GroupPlan:
    """Which of this rank's variables are shared with which ranks, and how to combine them.

    Group buffers move in rounds of at most ``bucket_bytes`` per group, so the transient
    memory of an exchange stays a few buckets, whatever the stage's size.

    Args:
        holders: for every variable of the model, in the same order on every rank, the
            ascending tuple of ranks holding it.
        dtypes: every variable's dtype (same order).
        shapes: every variable's shape (same order).
        local: for every variable, its index in this rank's value list, or ``None`` if
            this rank does not hold it.
        rank: this rank.
        size: the world size.
        bucket_bytes: most bytes of one group handled per round.
    """

    def __init__(self, holders: Sequence[tuple], dtypes: Sequence[tf.DType], shapes: Sequence[Sequence[int]],
                 local: Sequence[Optional[int]], rank: int, size: int, bucket_bytes: int = 64 << 20):
        self.rank, self.size = rank, size
        # Every rank takes part in the alltoalls or none does, as often as the largest group
        # anywhere needs: decided from global facts only.
        self.needed = any(len(h) > 1 for h in holders)
        totals: dict[tuple, int] = collections.defaultdict(int)
        groups: dict[tuple, _Group] = {}
        for members, dtype, shape, index in zip(holders, dtypes, shapes, local):
            if len(members) < 2:
                continue
            dtype = tf.as_dtype(dtype)
            key = (tuple(members), dtype.name)
            count = int(np.prod(shape, dtype=np.int64))
            totals[key] += count
            if index is None:
                continue
            group = groups.setdefault(key, _Group(tuple(members), dtype, step=_round_step(dtype, bucket_bytes)))
            group.slots.append((index, tuple(shape), group.size, count))
            group.size += count
        self.rounds = max([-(-n // _round_step(tf.as_dtype(key[1]), bucket_bytes)) for key, n in totals.items()] or [0])
        # One order for all ranks: members, then dtype name.
        self.groups = [groups[k] for k in sorted(groups)]

    def reduce(self, values: list, postscale: float = 1.0, name: str = "pipeline.group_sum") -> list:
        """Sums each grouped value over its group's members, times ``postscale``; others are returned as given."""
        return self._run(values, reduce=True, postscale=postscale, name=name)

    def broadcast(self, values: list, name: str = "pipeline.group_broadcast") -> list:
        """Gives every grouped value its first (lowest) member's value."""
        return self._run(values, reduce=False, postscale=1.0, name=name)

    # -- rounds of two alltoalls -----------------------------------------------------------------

    def _run(self, values: list, reduce: bool, postscale: float, name: str) -> list:
        if not self.needed:
            return list(values)
        out, pending = list(values), collections.defaultdict(list)
        for r in range(self.rounds):
            active = []  # (group index, group, first element, end) of the groups this round covers
            for k, g in enumerate(self.groups):
                if r * g.step < g.size:
                    active.append((k, g, r * g.step, min((r + 1) * g.step, g.size)))
            pieces = [self._take(g, values, lo, hi) for _, g, lo, hi in active]
            finished = self._exchange(active, pieces, reduce, postscale, f"{name}.{r}")
            for (_, g, lo, hi), piece in zip(active, finished):
                self._put(g, piece, lo, hi, pending, out)
        return out

    @staticmethod
    def _take(g: _Group, values: list, lo: int, hi: int) -> tf.Tensor:
        """Elements ``[lo, hi)`` of the group's variables laid end to end."""
        parts = []
        for index, _, offset, count in g.slots:
            a, b = max(lo, offset), min(hi, offset + count)
            if a < b:
                parts.append(tf.reshape(tf.cast(values[index], g.dtype), [-1])[a - offset:b - offset])
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]

    @staticmethod
    def _put(g: _Group, piece: tf.Tensor, lo: int, hi: int, pending: dict, out: list) -> None:
        """Hands elements ``[lo, hi)`` back to their variables; a variable is rebuilt once complete."""
        for index, shape, offset, count in g.slots:
            a, b = max(lo, offset), min(hi, offset + count)
            if a < b:
                pending[index].append(piece[a - lo:b - lo])
                if b == offset + count:
                    parts = pending.pop(index)
                    out[index] = tf.reshape(tf.concat(parts, 0) if len(parts) > 1 else parts[0], shape)

    @staticmethod
    def _chunk(length: int, members: int, j: int) -> tuple[int, int]:
        return length * j // members, length * (j + 1) // members

    def _exchange(self, active: list, pieces: list, reduce: bool, postscale: float, name: str) -> list:
        """One round: scatter chunks (and reduce them), then gather the finished chunks."""
        # Phase 1: chunk j of a piece goes to member j (for a broadcast, only from member 0).
        outgoing, expect = collections.defaultdict(list), collections.defaultdict(dict)
        for (k, g, lo, hi), piece in zip(active, pieces):
            n, me = len(g.members), g.members.index(self.rank)
            for j, peer in enumerate(g.members):
                if j == me:
                    continue
                if reduce or me == 0:
                    a, b = self._chunk(hi - lo, n, j)
                    outgoing[peer].append(to_bytes(piece[a:b]))
                if reduce or j == 0:
                    a, b = self._chunk(hi - lo, n, me)
                    expect[peer][k] = (b - a) * g.dtype.size
        incoming = self._alltoall(outgoing, expect, f"{name}.scatter")
        mine = []
        for (k, g, lo, hi), piece in zip(active, pieces):
            n, me = len(g.members), g.members.index(self.rank)
            a, b = self._chunk(hi - lo, n, me)
            if reduce:
                total = None
                for j, peer in enumerate(g.members):  # member order: the same sum on every rank
                    part = piece[a:b] if j == me else from_bytes(incoming[peer][k], g.dtype, [b - a])
                    total = part if total is None else total + part
                if postscale != 1.0:
                    if g.dtype.is_floating:
                        total = total * tf.cast(postscale, g.dtype)
                    else:  # integers: scale exactly, then truncate
                        total = tf.cast(tf.cast(total, tf.float64) * postscale, g.dtype)
                mine.append(total)
            else:
                mine.append(piece[a:b] if me == 0 else from_bytes(incoming[g.members[0]][k], g.dtype, [b - a]))

        # Phase 2: every member sends its finished chunk to all others.
        outgoing, expect = collections.defaultdict(list), collections.defaultdict(dict)
        for (k, g, lo, hi), chunk in zip(active, mine):
            n = len(g.members)
            for j, peer in enumerate(g.members):
                if peer != self.rank:
                    outgoing[peer].append(to_bytes(chunk))
                    a, b = self._chunk(hi - lo, n, j)
                    expect[peer][k] = (b - a) * g.dtype.size
        incoming = self._alltoall(outgoing, expect, f"{name}.gather")
        finished = []
        for (k, g, lo, hi), chunk in zip(active, mine):
            n, parts = len(g.members), []
            for j, peer in enumerate(g.members):
                a, b = self._chunk(hi - lo, n, j)
                parts.append(chunk if peer == self.rank else from_bytes(incoming[peer][k], g.dtype, [b - a]))
            finished.append(tf.concat(parts, 0))
        return finished

    def _alltoall(self, outgoing: dict, expect: dict, name: str) -> dict:
        """One world alltoall of byte pieces; returns ``{peer: {group index: bytes}}``."""
        splits, parts = [], []
        for peer in range(self.size):
            pieces = outgoing.get(peer, [])
            splits.append(sum(int(p.shape[0]) for p in pieces))
            parts.extend(pieces)
        send = tf.concat(parts, 0) if parts else tf.zeros([0], tf.uint8)
        received, received_splits = sd.alltoall(send, splits=splits, name=name)
        received_splits = received_splits.numpy().tolist()
        out, offset = {}, 0
        for peer in range(self.size):
            want = expect.get(peer, {})
            if received_splits[peer] != sum(want.values()):
                raise RuntimeError(f"{name}: rank {peer} sent {received_splits[peer]} bytes, expected "
                                   f"{sum(want.values())} (ranks disagree on the pipeline layout)")
            out[peer] = {}
            for k in sorted(want):
                out[peer][k] = received[offset:offset + want[k]]
                offset += want[k]
        return out
