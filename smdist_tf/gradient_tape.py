"""``DistributedGradientTape``: a GradientTape whose gradients are averaged over ranks."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from smdist_tf import process_sets as _process_sets, reduce_ops
from smdist_tf.buckets import gradient_buckets
from smdist_tf.collectives import grouped_allreduce
from smdist_tf.compression import Compression, Compressor, validate as validate_compression
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average, Sum
from smdist_tf.runtime import size


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape`` so ``gradient()`` returns gradients reduced over all ranks (or a process set's).

    Dense gradients are reduced in fused requests: inside a ``tf.function``, buckets
    issued in the order backpropagation produces them, so they travel while the rest of
    the backward pass runs (``smdist_tf.buckets``); eagerly, one request; with
    ``num_groups`` or ``groups``, one per group. ``tf.IndexedSlices``
    gradients (embeddings) are allgathered, or densified first with
    ``sparse_as_dense=True``; ``None`` gradients pass through. Works with Keras 3
    variables and ``tf.Variable`` alike (sources are never asked for ``.ref()``).

    Args:
        gradtape: the tape to wrap (before or after recording).
        device_dense: accepted for Horovod compatibility.
        device_sparse: accepted for Horovod compatibility.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16``.
        sparse_as_dense: densify ``tf.IndexedSlices`` before reducing.
        op: ``Average`` (default) or ``Sum``.
        gradient_predivide_factor: with ``Average``, divide by this before the sum and by
            ``size()/factor`` after it (trades overflow risk against precision).
        num_groups: split the gradients into this many fused requests (0: one request).
        groups: explicit grouping, a list of lists of variables; overrides ``num_groups``.
        process_set: the ``ProcessSet`` to reduce over (``None``: all ranks); ``size()``
            below then means the set's size. On a rank outside the set, as in Horovod,
            ``gradient()`` returns the local gradients unreduced.
        scale_local_gradients: divide the gradients of sources registered with
            ``register_local_source`` by ``size()``, as Horovod does.
    """

    def __init__(
        self,
        gradtape: tf.GradientTape,
        device_dense: str = "",
        device_sparse: str = "",
        compression: type[Compressor] = Compression.none,
        sparse_as_dense: bool = False,
        op: int = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Optional[Sequence[Sequence[Any]]] = None,
        process_set: Optional[ProcessSet] = None,
        scale_local_gradients: bool = True,
    ) -> None:
        _process_sets.process_set_id(process_set)  # a set that is not registered fails here
        op = reduce_ops.validate(op)
        if op not in (Average, Sum):
            raise ValueError("DistributedGradientTape supports op=Average or op=Sum")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        if num_groups < 0:
            raise ValueError("num_groups must be >= 0")
        self._tape = gradtape
        self._compression = validate_compression(compression)
        self._sparse_as_dense = sparse_as_dense
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self._num_groups = num_groups
        self._groups = groups
        self._scale_local = scale_local_gradients
        self._process_set = process_set
        # By identity: Keras 3 variables have no .ref() and compare by value.
        self._local_sources: dict[int, Any] = {}

    def register_local_source(self, source: Any) -> None:
        """Keeps ``source``'s gradient local: it is never reduced (Horovod's local variables).

        With ``scale_local_gradients`` (the default) the local gradient is divided by
        ``size()``, as Horovod does.
        """
        self._local_sources[id(source)] = source

    def __enter__(self) -> "DistributedGradientTape":
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tape.__exit__(*exc)

    def __getattr__(self, attr: str) -> Any:
        # watch(), stop_recording(), reset(), jacobian() ... act on the wrapped tape.
        return getattr(self._tape, attr)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """Computes local gradients, then returns them reduced over all ranks (same structure as ``sources``)."""
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, unconnected_gradients=unconnected_gradients)
        flat_grads = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        reduced = self._reduce(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)

    def _ranks(self) -> int:
        return size() if self._process_set is None else self._process_set.size()

    def _reduce(self, grads: list, sources: list) -> list:
        if self._ranks() == 1 and self._op == Average and self._predivide == 1.0:
            return grads
        if self._process_set is not None and not self._process_set.included():
            return grads  # as Horovod: a rank outside the set keeps its own gradients
        if self._sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        op, prescale, postscale = self._op, 1.0, 1.0
        if self._predivide != 1.0:
            # Average, not Sum with postscale factor/size(): the engine then divides by the ranks
            # that contributed, which is fewer than size() while some rank is inside join().
            prescale, postscale = 1.0 / self._predivide, self._predivide
        result = list(grads)
        if self._local_sources:
            is_local = [id(src) in self._local_sources for src in sources]
            result = [self._scaled_local(g) if local and g is not None else g for g, local in zip(grads, is_local)]
            grads = [None if local else g for g, local in zip(grads, is_local)]
        for positions in self._partition(grads, sources):
            reduced = grouped_allreduce(
                [grads[i] for i in positions], op=op, prescale_factor=prescale, postscale_factor=postscale,
                compression=self._compression, process_set=self._process_set,
            )
            for i, r in zip(positions, reduced):
                result[i] = r
        return result

    def _scaled_local(self, grad: Any) -> Any:
        ranks = self._ranks()
        if not self._scale_local or ranks == 1:
            return grad
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / tf.cast(ranks, grad.values.dtype), grad.indices, grad.dense_shape)
        return grad / tf.cast(ranks, grad.dtype)

    def _partition(self, grads: list, sources: list) -> list:
        """Index lists of the non-None gradients, one list per fused request."""
        present = [i for i, g in enumerate(grads) if g is not None]
        if self._groups is not None:
            group_of = {}
            for gi, group in enumerate(self._groups):
                for var in group:
                    group_of[id(var)] = gi
            buckets: dict = {}
            for i in present:
                buckets.setdefault(group_of.get(id(sources[i]), len(self._groups)), []).append(i)
            return [buckets[k] for k in sorted(buckets)]
        if self._num_groups > 0 and present:
            n = min(self._num_groups, len(present))
            per = -(-len(present) // n)
            return [present[k : k + per] for k in range(0, len(present), per)]
        return gradient_buckets(grads, present)


def PartialDistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    local_layers: Any = None,
    groups: Optional[Sequence[Sequence[Any]]] = None,
    process_set: Optional[ProcessSet] = None,
    scale_local_gradients: bool = True,
) -> DistributedGradientTape:
    """A ``DistributedGradientTape`` that keeps the gradients of ``local_layers`` local (Horovod's spelling).

    Args:
        gradtape: the tape to wrap.
        device_dense: accepted for Horovod compatibility.
        device_sparse: accepted for Horovod compatibility.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16``.
        sparse_as_dense: densify ``tf.IndexedSlices`` before reducing.
        op: ``Average`` (default) or ``Sum``.
        gradient_predivide_factor: as for ``DistributedGradientTape``.
        local_layers: a Keras layer or a list of them whose trainable weights are not reduced.
        groups: explicit grouping of the reduced variables.
        process_set: the ``ProcessSet`` to reduce over (``None``: all ranks).
        scale_local_gradients: divide the local gradients by ``size()``, as Horovod does.

    Returns:
        The tape, with every trainable weight of ``local_layers`` registered as a local source.
    """
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    tape = DistributedGradientTape(
        gradtape, device_dense, device_sparse, compression, sparse_as_dense, op, gradient_predivide_factor,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
    )
    for layer in local_layers:
        for weight in layer.trainable_weights:
            tape.register_local_source(weight)
    return tape
