"""``DistributedGradientTape``: a GradientTape whose gradients are averaged over ranks."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from smdist_tf.compression import Compression, Compressor
from smdist_tf.gradient_reducer import GradientReducer
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape`` so ``gradient()`` returns gradients reduced over all ranks (or a process set's).

    Its ``reducer`` (a ``smdist_tf.GradientReducer`` made from the arguments below) does the
    reducing: fused requests that overlap the backward pass inside a ``tf.function``,
    ``tf.IndexedSlices`` allgathered (or densified with ``sparse_as_dense=True``),
    ``None`` gradients passed through. Works with Keras 3 variables and ``tf.Variable``
    alike (sources are never asked for ``.ref()``).

    Args:
        gradtape: the tape to wrap (before or after recording).
        device_dense: accepted for Horovod compatibility.
        device_sparse: accepted for Horovod compatibility.
        compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
            process_set, scale_local_gradients: the reduction's settings, as documented on
            ``GradientReducer``. With a ``process_set``, a rank outside it gets its local
            gradients back unreduced, as in Horovod; ``scale_local_gradients`` applies to
            sources registered with ``register_local_source``.
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
        self._tape = gradtape
        self.reducer = GradientReducer(
            compression=compression, sparse_as_dense=sparse_as_dense, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients,
        )
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
        reduced = self.reducer.reduce(tf.nest.flatten(grads), tf.nest.flatten(sources), self.local_sources())
        return tf.nest.pack_sequence_as(grads, reduced)

    def local_sources(self) -> list:
        """The sources registered with ``register_local_source``."""
        return list(self._local_sources.values())

    def local_gradient(self, target: Any, sources: Any) -> Any:
        """The wrapped tape's own gradients of ``target``: this rank's, not reduced."""
        return self._tape.gradient(target, sources)


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
        local_layers: a Keras layer or a list of them whose trainable weights are not reduced.
        compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set,
            scale_local_gradients: as for ``DistributedGradientTape`` (``GradientReducer``'s settings).

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
