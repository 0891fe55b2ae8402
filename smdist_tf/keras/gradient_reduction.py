"""What a ``DistributedOptimizer`` of either Keras keeps: its ``GradientReducer`` and its local sources."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from smdist_tf.gradient_reducer import GradientReducer
from smdist_tf.process_sets import ProcessSet


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

    The reducer and the accumulation settings live on the dynamic class, so ``from_config``
    on it rebuilds an equally configured optimizer while ``get_config`` stays the wrapped
    class's own config.
    """

    _smdist_reducer: GradientReducer
    _smdist_backward_passes_per_step: int = 1
    _smdist_average_aggregated_gradients: bool = False

    @property
    def _smdist_reduces_in_apply(self) -> bool:
        return True

    @property
    def smdist_process_set(self) -> Optional[ProcessSet]:
        """The process set this optimizer reduces over (``None``: all ranks)."""
        return self._smdist_reducer.process_set

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

    def _smdist_reduced(self, grads: Sequence[Any], variables: Sequence[Any]) -> list:
        """``grads`` reduced over the ranks, the local sources' kept on this rank."""
        return self._smdist_reducer.reduce(grads, variables, self.smdist_local_sources().resolved())


def distributed_class(mixin: type, base: type, reducer: GradientReducer, backward_passes_per_step: int = 1,
                      average_aggregated_gradients: bool = False) -> type:
    """A subclass of ``base`` with ``mixin`` in front, carrying the settings; same name and module as ``base``."""
    return type(base.__name__, (mixin, base), {
        "_smdist_reducer": reducer,
        "_smdist_backward_passes_per_step": int(backward_passes_per_step),
        "_smdist_average_aggregated_gradients": average_aggregated_gradients,
        "__module__": base.__module__,
    })
