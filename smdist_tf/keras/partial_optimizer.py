"""``PartialDistributedOptimizer``: a ``DistributedOptimizer`` that leaves some layers' gradients local."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from smdist_tf.compression import Compression, Compressor
from smdist_tf.keras.optimizer import DistributedOptimizer
from smdist_tf.keras_api import keras_api
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average

keras = keras_api()  # local_layers are layers of the Keras tf.keras is


def PartialDistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Optional[Sequence[Sequence[Any]]] = None,
    process_set: Optional[ProcessSet] = None,
    local_layers: Union[keras.layers.Layer, Sequence[keras.layers.Layer], None] = None,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """A :func:`DistributedOptimizer` that does not reduce the gradients of ``local_layers``.

    For model-parallel parts of a model (say, an embedding sharded over ranks): the
    trainable weights of ``local_layers``, and variables passed to the result's
    ``register_local_var``, are updated from this rank's gradient alone; every other
    gradient is reduced as by ``DistributedOptimizer``. The layers' weights are looked
    up when the training step is traced, so layers may still be unbuilt here.

    Args:
        optimizer: the Keras optimizer to wrap (its config is copied).
        name: optional new name for the optimizer.
        device_dense: accepted for Horovod compatibility.
        device_sparse: accepted for Horovod compatibility.
        compression: ``Compression.none``, ``.fp16``, ``.bf16`` or ``.int8``.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before reducing.
        gradient_predivide_factor: as for ``DistributedOptimizer``.
        op: ``Average``, ``Sum`` or ``Adasum``.
        backward_passes_per_step: accumulate this many local gradients before each update.
        average_aggregated_gradients: divide the accumulated gradients by ``backward_passes_per_step``.
        groups: explicit grouping of variables into fused requests.
        process_set: the ``ProcessSet`` to average over (``None``: all ranks).
        local_layers: a Keras layer or a sequence of them.
        scale_local_gradients: divide the local gradients by ``size()``, as Horovod does.

    Returns:
        The optimizer: an instance of a subclass of ``optimizer``'s class, with the same class name.

    Raises:
        ValueError: when ``local_layers`` holds something that is not a Keras layer.
    """
    if local_layers is None:
        layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        layers = [local_layers]
    else:
        layers = list(local_layers)
    if not all(isinstance(layer, keras.layers.Layer) for layer in layers):
        raise ValueError("local_layers must be Keras layers")
    partial = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step, average_aggregated_gradients=average_aggregated_gradients,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)
    partial.smdist_local_sources().layers.extend(layers)
    return partial
