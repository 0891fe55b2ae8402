"""``TensorFlowKerasState`` and ``TensorFlowState``: variables (plus Python values) that survive a restart."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from smdist_tf.collectives import broadcast_variables
from smdist_tf.elastic.state import ObjectState
from smdist_tf.keras_api import require_keras_3
from smdist_tf.sharding.optimizer import sharded_optimizers


def _read(variables: Sequence[Any]) -> list[np.ndarray]:
    # Copies: the snapshot must not change when the variables do.
    return [np.array(v.numpy(), copy=True) for v in variables]


def _check_layout(variables: Sequence[Any], values: Sequence[np.ndarray]) -> None:
    """Raises ValueError unless ``values`` fit ``variables`` one to one, shape for shape."""
    if len(values) != len(variables):
        raise ValueError(f"the commit holds {len(values)} variables, this program has {len(variables)}")
    for variable, value in zip(variables, values):
        if tuple(variable.shape) != value.shape:
            raise ValueError(f"variable {getattr(variable, 'path', variable.name)} has shape "
                             f"{tuple(variable.shape)}, the commit has {value.shape}")


def _assign(variables: Sequence[Any], values: Sequence[np.ndarray]) -> None:
    for variable, value in zip(variables, values):
        variable.assign(value)


class _VariablesState(ObjectState):
    """ObjectState plus a list of variables that ``_variables()`` returns."""

    def _variables(self) -> list[Any]:
        raise NotImplementedError

    def __init__(self, **kwargs: Any) -> None:
        self._saved_values = _read(self._variables())
        super().__init__(**kwargs)

    def save(self) -> None:
        self._saved_values = _read(self._variables())
        super().save()

    def restore(self) -> None:
        _assign(self._variables(), self._saved_values)
        super().restore()

    def sync(self) -> None:
        variables = self._variables()
        if variables:
            broadcast_variables(variables, root_rank=0, name="smdist.elastic.sync")
        self._saved_values = _read(variables)
        super().sync()

    def _snapshot(self) -> dict[str, Any]:
        return {**super()._snapshot(), "variables": self._saved_values}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        _check_layout(self._variables(), snapshot["variables"])
        self._saved_values = [np.array(v, copy=True) for v in snapshot["variables"]]
        super()._load_snapshot(snapshot)


class TensorFlowKerasState(_VariablesState):
    """A Keras 3 model, its optimizer, and Python values (``epoch=0, batch=0``) as attributes.

    Saves and commits the model's variables (``model.variables``: weights, non-trainable
    statistics, random seed states) and the optimizer's (``optimizer.variables``:
    iteration count, learning rate, slots). Keras creates an optimizer's variables when
    it is built, usually at the first training step, so an optimizer that is not built
    yet is built here for the model's trainable variables.

    Args:
        model: a built Keras model.
        optimizer: its optimizer; ``model.optimizer`` (from ``compile``) when None.
        backend: accepted for Horovod compatibility (TensorFlow 1 sessions); unused.
        **kwargs: Python values kept as attributes, as for ``ObjectState``.

    Raises:
        ValueError: the model is not built, or its optimizer state is sharded (a
            restarted job may have another number of ranks, so shards cannot be restored).
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        require_keras_3("elastic.TensorFlowKerasState")
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if sharded_optimizers(self.optimizer):
            raise ValueError("elastic state cannot hold sharded optimizer state (shards change with the number of "
                             "ranks); train elastic jobs without shard_optimizer_state")
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        super().__init__(**kwargs)

    def _variables(self) -> list[Any]:
        optimizer_variables = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.variables) + optimizer_variables


class TensorFlowState(_VariablesState):
    """A list of ``tf.Variable`` (or Keras variables) and Python values as attributes.

    Args:
        variables: the variables to keep. TensorFlow 2 has no global variable
            collection to default to, so None means none.
        **kwargs: Python values kept as attributes, as for ``ObjectState``.
    """

    def __init__(self, variables: Sequence[Any] | None = None, **kwargs: Any) -> None:
        self.variables = list(variables or [])
        super().__init__(**kwargs)

    def _variables(self) -> list[Any]:
        return self.variables
