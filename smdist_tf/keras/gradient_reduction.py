"""What a ``DistributedOptimizer`` of either Keras keeps: its reduction settings and its local sources."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from smdist_tf.compression import Compression, Compressor
from smdist_tf.gradient_tape import DistributedGradientTape
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average


def reduction_settings(
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Optional[Sequence[Sequence[Any]]] = None,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    scale_local_gradients: bool = True,
    process_set: Optional[ProcessSet] = None,
) -> dict:
    """The settings a distributed optimizer class carries (``DistributedOptimizer``'s arguments)."""
    return dict(
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        num_groups=num_groups,
        groups=groups,
        backward_passes_per_step=int(backward_passes_per_step),
        average_aggregated_gradients=average_aggregated_gradients,
        scale_local_gradients=scale_local_gradients,
        process_set=process_set,
    )


class LocalSources:
    """The layers and variables whose gradients stay on this rank (Horovod's local variables).

    A plain object, not a list attribute of the optimizer: Keras would track variables in
    such a list as the optimizer's own and save layers found there with it.
    """

    def __init__(self) -> None:
        self.layers: list = []
        self.variables: list = []

    def resolved(self) -> list:
        # Layers are resolved now, not when registered: they may have been unbuilt then.
        return [v for layer in self.layers for v in layer.trainable_weights] + self.variables


class GradientReduction:
    """Mixed in front of a wrapped optimizer's class (through a Keras-specific subclass).

    Settings live on the dynamic class, so ``from_config`` on it rebuilds an equally
    configured optimizer while ``get_config`` stays the wrapped class's own config.
    """

    _smdist_settings: dict = {}

    @property
    def _smdist_reduces_in_apply(self) -> bool:
        return True

    def smdist_local_sources(self) -> LocalSources:
        """This optimizer's local layers and variables (created on first use)."""
        if not hasattr(self, "_smdist_local"):
            self._smdist_local = LocalSources()
        return self._smdist_local

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient on this rank (not reduced), as Horovod's ``register_local_var``.

        With ``scale_local_gradients`` (the default) it is divided by ``size()``. Register
        before the first training step: ``fit`` traces the step once.
        """
        self.smdist_local_sources().variables.append(var)

    def _smdist_reducer(self) -> DistributedGradientTape:
        # The tape's reduction (fusion, groups, sparse handling, local sources) without a recorded tape.
        s = self._smdist_settings
        reducer = DistributedGradientTape(
            None,
            compression=s["compression"],
            sparse_as_dense=s["sparse_as_dense"],
            op=s["op"],
            gradient_predivide_factor=s["gradient_predivide_factor"],
            num_groups=s["num_groups"],
            groups=s["groups"],
            process_set=s["process_set"],
            scale_local_gradients=s["scale_local_gradients"],
        )
        for var in self.smdist_local_sources().resolved():
            reducer.register_local_source(var)
        return reducer


def distributed_class(mixin: type, base: type, settings: dict) -> type:
    """A subclass of ``base`` with ``mixin`` in front, carrying ``settings``; same name and module as ``base``."""
    return type(base.__name__, (mixin, base), {"_smdist_settings": settings, "__module__": base.__module__})
