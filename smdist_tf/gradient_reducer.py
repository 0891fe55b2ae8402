"""``GradientReducer``: Horovod's gradient-reduction settings and the one place that applies them.

``DistributedGradientTape``, both ``DistributedOptimizer``s (Keras 3 and Keras 2), their
partial variants and optimizer-state sharding all reduce gradients through one of these.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional, Sequence

import tensorflow as tf

from smdist_tf import process_sets as _process_sets, reduce_ops
from smdist_tf.buckets import gradient_buckets
from smdist_tf.collectives import grouped_allreduce
from smdist_tf.compression import Compression, Compressor, validate as validate_compression
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Adasum, Average, Sum
from smdist_tf.runtime import size


@dataclasses.dataclass(frozen=True, eq=False)
class GradientReducer:
    """How gradients are reduced over the ranks, and ``reduce`` to do it.

    Dense gradients are reduced in fused requests: inside a ``tf.function``, buckets
    issued in the order backpropagation produces them, so they travel while the rest of
    the backward pass runs (``smdist_tf.buckets``); eagerly, one request; with
    ``num_groups`` or ``groups``, one per group. ``tf.IndexedSlices`` gradients
    (embeddings) are allgathered, or densified first with ``sparse_as_dense=True``;
    ``None`` gradients pass through. Variables are matched by identity (Keras 3
    variables have no ``.ref()`` and compare by value).

    Attributes:
        compression: ``Compression.none``, ``.fp16``, ``.bf16`` or ``.int8``.
        sparse_as_dense: densify ``tf.IndexedSlices`` before reducing.
        op: ``Average`` (default), ``Sum`` or ``Adasum`` (``smdist_tf.reduce_ops``: sparse
            gradients then need ``sparse_as_dense=True``).
        gradient_predivide_factor: with ``Average``, divide by this before the sum and by
            ``size()/factor`` after it (trades overflow risk against precision).
        num_groups: split the gradients into this many fused requests (0: one request).
        groups: explicit grouping, a list of lists of variables; overrides ``num_groups``.
        process_set: the ``ProcessSet`` to reduce over (``None``: all ranks). On a rank
            outside the set, as in Horovod, gradients come back unreduced.
        scale_local_gradients: divide local gradients (never reduced) by the ranks' count, as Horovod does.

    Raises:
        ValueError: an unknown or unsupported ``op``, ``gradient_predivide_factor`` without
            ``Average``, a negative ``num_groups``, a bad compressor or an unregistered set.
    """

    compression: type[Compressor] = Compression.none
    sparse_as_dense: bool = False
    op: int = Average
    gradient_predivide_factor: float = 1.0
    num_groups: int = 0
    groups: Optional[Sequence[Sequence[Any]]] = None
    process_set: Optional[ProcessSet] = None
    scale_local_gradients: bool = True

    def __post_init__(self) -> None:
        _process_sets.process_set_id(self.process_set)  # a set that is not registered fails here
        op = reduce_ops.validate(self.op)
        if op not in (Average, Sum, Adasum):
            raise ValueError(f"gradients are reduced with op=Average or op=Sum (or op=Adasum), not {reduce_ops.op_name(op)}")
        if self.gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        if self.num_groups < 0:
            raise ValueError("num_groups must be >= 0")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "compression", validate_compression(self.compression))
        object.__setattr__(self, "gradient_predivide_factor", float(self.gradient_predivide_factor))

    @property
    def scale_factors(self) -> tuple[float, float]:
        """``(prescale_factor, postscale_factor)`` that carry out ``gradient_predivide_factor``.

        Average, not Sum with postscale factor/size(): the engine then divides by the ranks
        that contributed, which is fewer than size() while some rank is inside join().
        """
        if self.gradient_predivide_factor == 1.0:
            return 1.0, 1.0
        return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor

    def ranks(self) -> int:
        """The number of ranks the gradients are reduced over."""
        return size() if self.process_set is None else self.process_set.size()

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], local_variables: Iterable[Any] = ()) -> list:
        """Returns ``grads`` (one per variable, or ``None``) reduced over the ranks.

        Args:
            grads: the local gradients, a flat sequence.
            variables: the variables (sources) they belong to, in the same order.
            local_variables: variables whose gradients stay on this rank (Horovod's local
                variables), divided by ``ranks()`` with ``scale_local_gradients``.
        """
        grads = list(grads)
        prescale, postscale = self.scale_factors
        if self.ranks() == 1 and self.op == Average and prescale == 1.0:
            return grads
        if self.process_set is not None and not self.process_set.included():
            return grads  # as Horovod: a rank outside the set keeps its own gradients
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        result = list(grads)
        local_ids = {id(v) for v in local_variables}
        if local_ids:
            is_local = [id(v) in local_ids for v in variables]
            result = [self._scaled_local(g) if local and g is not None else g for g, local in zip(grads, is_local)]
            grads = [None if local else g for g, local in zip(grads, is_local)]
        for positions in self._partition(grads, variables):
            reduced = grouped_allreduce(
                [grads[i] for i in positions], op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                compression=self.compression, process_set=self.process_set,
            )
            for i, r in zip(positions, reduced):
                result[i] = r
        return result

    def _scaled_local(self, grad: Any) -> Any:
        ranks = self.ranks()
        if not self.scale_local_gradients or ranks == 1:
            return grad
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / tf.cast(ranks, grad.values.dtype), grad.indices, grad.dense_shape)
        return grad / tf.cast(ranks, grad.dtype)

    def _partition(self, grads: list, variables: Sequence[Any]) -> list:
        """Index lists of the non-None gradients, one list per fused request."""
        present = [i for i, g in enumerate(grads) if g is not None]
        if self.groups is not None:
            group_of = {id(var): gi for gi, group in enumerate(self.groups) for var in group}
            buckets: dict = {}
            for i in present:
                buckets.setdefault(group_of.get(id(variables[i]), len(self.groups)), []).append(i)
            return [buckets[k] for k in sorted(buckets)]
        if self.num_groups > 0 and present:
            n = min(self.num_groups, len(present))
            per = -(-len(present) // n)
            return [present[k : k + per] for k in range(0, len(present), per)]
        return gradient_buckets(grads, present)
