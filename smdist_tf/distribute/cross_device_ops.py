"""``SmdistCrossDeviceOps``: every tf.distribute reduction, gather and all-reduce through smdist_tf collectives."""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from smdist_tf import _compat
from smdist_tf.buckets import gradient_buckets
from smdist_tf.collectives import allgather, grouped_allreduce
from smdist_tf.compression import Compression, Compressor
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average, Sum
from smdist_tf.runtime import size

# Dtypes the engine reduces directly; narrower integers and bool travel as int32.
_NATIVE = (tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64)
_WIDENED = (tf.bool, tf.int16, tf.uint16, tf.uint32)


def _engine_op(reduce_op: Any) -> int:
    # tf.distribute.ReduceOp has exactly two members, SUM and MEAN.
    reduce_op = tf.distribute.ReduceOp(reduce_op.upper()) if isinstance(reduce_op, str) else reduce_op
    return Sum if reduce_op == tf.distribute.ReduceOp.SUM else Average


def local_value(value: Any) -> Any:
    """This process's component of a (one-replica) distributed value, or the value itself."""
    if isinstance(value, _compat.DistributedValues):
        (component,) = value.values
        return component
    return value


def group_size(process_set: Optional[ProcessSet]) -> int:
    """The number of replicas: all ranks, or the process set's members."""
    return size() if process_set is None else process_set.size()


def reduce_flat(reduce_op: Any, flat: list, compression: type[Compressor] = Compression.none,
                process_set: Optional[ProcessSet] = None, bytes_per_pack: int = 0) -> list:
    """Reduces a flat list of tensors / ``IndexedSlices`` over all ranks (or a set's).

    Inside a ``tf.function`` in buckets issued last tensor first (gradients, in the
    order backpropagation makes them; ``smdist_tf.buckets``), of at most
    ``bytes_per_pack`` bytes when given; eagerly in one fused request.
    """
    op = _engine_op(reduce_op)
    tensors, restore = [], []
    for item in flat:
        if isinstance(item, tf.IndexedSlices):
            tensors.append(item)
            restore.append(None)
            continue
        t = tf.convert_to_tensor(item)
        if t.dtype in _WIDENED:
            # bool SUM means "how many ranks said yes"; cast back keeps the caller's dtype.
            tensors.append(tf.cast(t, tf.int32))
            restore.append(t.dtype)
        elif t.dtype in _NATIVE:
            tensors.append(t)
            restore.append(None)
        else:
            raise TypeError(f"DataParallelStrategy cannot reduce dtype {t.dtype.name}")
    if not tensors:
        return []
    # Integers cannot be averaged in place: sum, then divide like TF does.
    integer = [not isinstance(t, tf.IndexedSlices) and t.dtype.is_integer for t in tensors]
    divide = op == Average and any(integer)
    float_compression = compression if not any(integer) else Compression.none
    reduced: list = [None] * len(tensors)
    for bucket in gradient_buckets(tensors, list(range(len(tensors))), bytes_per_pack):
        results = grouped_allreduce([tensors[i] for i in bucket], op=Sum if divide else op,
                                    compression=float_compression, process_set=process_set)
        for i, r in zip(bucket, results):
            reduced[i] = _divide(r, group_size(process_set)) if divide else r
    return [tf.cast(r, dtype) if dtype is not None else r for r, dtype in zip(reduced, restore)]


def _divide(value: Any, n: int) -> Any:
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(_divide(value.values, n), value.indices, value.dense_shape)
    if value.dtype.is_integer:
        return value // n
    return value / tf.cast(n, value.dtype)


def gather_tensor(value: tf.Tensor, axis: int, process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """Concatenates every rank's ``value`` along ``axis`` (allgather works on axis 0)."""
    value = tf.convert_to_tensor(value)
    if value.shape.rank == 0 or axis == 0:
        return allgather(value, process_set=process_set)
    perm = [axis] + [i for i in range(value.shape.rank) if i != axis]
    gathered = allgather(tf.transpose(value, perm), process_set=process_set)
    inverse = [perm.index(i) for i in range(len(perm))]
    return tf.transpose(gathered, inverse)


def _as_mirrored(tensor: Any) -> Any:
    return _compat.regroup((tensor,), wrap_class=_compat.Mirrored)


class SmdistCrossDeviceOps(tf.distribute.CrossDeviceOps):
    """A ``tf.distribute.CrossDeviceOps`` for one replica per process, talking to other processes.

    The reductions of a step (all gradients) become ``grouped_allreduce`` requests in
    buckets, issued as backpropagation produces them (see :func:`reduce_flat`); a
    ``CommunicationOptions(bytes_per_pack=...)`` sets the bucket size. Gathers use
    ``allgather``.

    Args:
        compression: wire compression for floating-point reductions.
        process_set: the ``ProcessSet`` whose members are the replicas (``None``: all ranks).
    """

    def __init__(self, compression: type[Compressor] = Compression.none,
                 process_set: Optional[ProcessSet] = None) -> None:
        super().__init__()
        self._compression = compression
        self.process_set = process_set

    @property
    def _num_between_graph_workers(self) -> int:
        # Above 1 the base class never short-cuts a single local value without communicating.
        return max(group_size(self.process_set), 2)

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        (reduced,) = self.reduce_tensors(reduce_op, [local_value(per_replica_value)])
        return _as_mirrored(reduced)

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        flat = [local_value(value) for value, _ in value_destination_pairs]
        return [_as_mirrored(r) for r in self.reduce_tensors(reduce_op, flat, _bytes_per_pack(options))]

    def _gather_implementation(self, per_replica_value, destinations, axis, options):
        return _as_mirrored(gather_tensor(local_value(per_replica_value), axis, self.process_set))

    def _all_reduce(self, reduce_op, value, replica_id, options):
        flat = tf.nest.flatten(value, expand_composites=False)
        return tf.nest.pack_sequence_as(value, self.reduce_tensors(reduce_op, flat, _bytes_per_pack(options)))

    def reduce_tensors(self, reduce_op: Any, flat: list, bytes_per_pack: int = 0) -> list:
        """:func:`reduce_flat` with this object's compression and process set."""
        return reduce_flat(reduce_op, flat, self._compression, self.process_set, bytes_per_pack)


def _bytes_per_pack(options: Any) -> int:
    """The bucket size a ``tf.distribute.experimental.CommunicationOptions`` (or None) asks for (0: ours)."""
    return 0 if options is None else int(options.bytes_per_pack or 0)
