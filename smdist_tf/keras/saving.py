"""``load_model``: a saved Keras model whose optimizer comes back as a ``DistributedOptimizer``."""

from __future__ import annotations

import inspect
import os
from typing import Any, Optional, Sequence, Union

import keras

from smdist_tf.compression import Compression, Compressor
from smdist_tf.gradient_reducer import GradientReducer
from smdist_tf.keras.optimizer import DistributedOptimizer, distributed_optimizer_class
from smdist_tf.keras.patches import install_keras_patches
from smdist_tf.keras_api import keras_api, uses_tf_keras

# Optimizers that wrap others: the optimizers inside them are wrapped instead.
_WRAPPERS = (keras.optimizers.Optimizer, keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)


class _Distributing:
    """Stands in for an optimizer class while Keras deserializes: builds it, then wraps it.

    Keras looks a saved object's registered name up among the custom objects first and
    calls ``from_config`` on what it finds; the optimizer's saved variables are then
    loaded into the wrapped optimizer.
    """

    def __init__(self, cls: type, compression: type[Compressor]) -> None:
        self._cls = cls
        self._compression = compression

    def from_config(self, config: dict) -> keras.optimizers.Optimizer:
        return DistributedOptimizer(self._cls.from_config(config), compression=self._compression)


def _keras_optimizer_classes() -> list[type]:
    return [cls for cls in vars(keras.optimizers).values()
            if inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer) and cls not in _WRAPPERS]


def load_model(
    filepath: Union[str, os.PathLike],
    custom_optimizers: Optional[Sequence[type]] = None,
    custom_objects: Optional[dict[str, Any]] = None,
    compression: type[Compressor] = Compression.none,
    partial_distributed_optimizer: bool = False,
) -> keras.Model:
    """Loads a saved Keras model with its optimizer wrapped in :func:`DistributedOptimizer`.

    The optimizer's saved state (iteration count, learning rate, slots) is loaded into
    the distributed optimizer, so training resumes where it stopped. Every optimizer of
    ``keras.optimizers`` is wrapped without being named; a model saved with a
    ``DistributedOptimizer`` saved a plain one and is wrapped again here. With Keras 2
    (``TF_USE_LEGACY_KERAS=1``) the model loads through ``tf_keras`` and its restored
    optimizer becomes distributed in place.

    Args:
        filepath: a ``.keras`` file (or a legacy ``.h5`` file) that ``keras.saving.load_model`` reads.
        custom_optimizers: your own optimizer classes the file may use; they are wrapped too.
        custom_objects: other classes and functions the file needs. As in Horovod, an
            optimizer named here is loaded as given, not wrapped.
        compression: the wrapped optimizer's ``compression``.
        partial_distributed_optimizer: Horovod's switch to wrap in ``PartialDistributedOptimizer``
            instead. Ours are one: the wrapped optimizer takes ``register_local_var`` either way,
            and a file holds no local layers, so both load the same.

    Returns:
        The model, compiled as it was saved.
    """
    custom_objects = dict(custom_objects or {})
    if uses_tf_keras():
        return _load_tf_keras_model(filepath, list(custom_optimizers or []), custom_objects, compression)
    stand_ins = {
        keras.saving.get_registered_name(cls): _Distributing(cls, compression)
        for cls in [*_keras_optimizer_classes(), *(custom_optimizers or [])]
    }
    stand_ins = {name: obj for name, obj in stand_ins.items() if name not in custom_objects}
    # Keras prefers its global registry to custom_objects (and to a CustomObjectScope), so a
    # registered custom optimizer would load unwrapped: the stand-ins go into that registry
    # for the duration of the load.
    registry = keras.saving.get_custom_objects()
    shadowed = {name: registry[name] for name in stand_ins if name in registry}
    registry.update(stand_ins)
    try:
        return keras.saving.load_model(filepath, custom_objects=custom_objects)
    finally:
        for name in stand_ins:
            del registry[name]
        registry.update(shadowed)


def _load_tf_keras_model(filepath: Union[str, os.PathLike], custom_optimizers: list[type],
                         custom_objects: dict[str, Any], compression: type[Compressor]) -> Any:
    """Keras 2: loads the model as ``tf_keras`` does, then makes its optimizer distributed in place.

    Turning the restored optimizer's class into its distributed subclass keeps the state
    Keras 2 restored into it; Keras 2's optimizer deserialization (lower-cased names,
    two optimizer families) is left alone.
    """
    # Unnamed custom optimizers still have to be found; an optimizer named in custom_objects stays unwrapped.
    unwrapped = set(custom_objects.values())
    findable = {cls.__name__: cls for cls in custom_optimizers}
    model = keras_api().models.load_model(filepath, custom_objects={**findable, **custom_objects})
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # inside a LossScaleOptimizer
    if optimizer is not None and type(optimizer) not in unwrapped:
        optimizer.__class__ = distributed_optimizer_class(type(optimizer), GradientReducer(compression=compression))
        install_keras_patches()
    return model
