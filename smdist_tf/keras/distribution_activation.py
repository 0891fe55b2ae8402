"""A current ``keras.distribution`` on TensorFlow is smdist_tf's ``DataParallelStrategy``, set globally.

Keras' TensorFlow trainer, optimizers and losses look only at ``tf.distribute``: a model
is distributed when it is made under a strategy's scope. So while a ``DataParallel`` (or a
``ModelParallel`` that asks for no more) is current, through
``keras.distribution.set_distribution`` or ``Distribution.scope()``, the job's strategy is
set with TensorFlow's ``tf.distribute.experimental_set_strategy``, and unset when no
distribution is current any more. Both spellings store the distribution through Keras'
``global_state.set_global_attribute``; ``patch_distribution_activation`` wraps it there
(see smdist_tf/_compat.py), so every way of setting one is seen.

A distribution asking for more than data parallelism (a layout sharding weights or
activations over a mesh axis other than the batch's) raises ``NotImplementedError``
naming the layout, before anything becomes current: on every rank alike, with no
collective started, so nothing hangs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf

from smdist_tf import _compat

# The job's strategy, made on first use by the factory smdist_tf.keras.distribution registers
# (that module knows DataParallelStrategy; this one is below the Keras patch registry).
_strategy_factory: Optional[Callable[[], Any]] = None
_strategy: Any = None
# The strategy this module set globally, while it is set.
_set_strategy: Any = None


def serve_with(factory: Callable[[], Any]) -> None:
    """Registers what makes the job's strategy (called once, when first needed)."""
    global _strategy_factory
    _strategy_factory = factory


def job_strategy() -> Any:
    """The ``DataParallelStrategy`` every ``keras.distribution`` of this process runs on."""
    global _strategy
    if _strategy is None:
        if _strategy_factory is None:
            raise RuntimeError("keras.distribution on TensorFlow needs smdist_tf.keras.use_keras_distribution() first")
        _strategy = _strategy_factory()
    return _strategy


def _current_batch_axis(layout: Any) -> Optional[str]:
    import keras  # Keras 3: use_keras_distribution() made sure

    distribution = keras.distribution.distribution()
    if distribution is not None:
        return distribution.batch_dim_name
    mesh = layout.device_mesh
    return None if mesh is None else mesh.axis_names[0]


def require_data_parallel_layout(layout: Any, what: str, batch_axis: Optional[str] = None) -> None:
    """Raises unless ``layout`` replicates, or shards only dimension 0 over the batch axis.

    A mesh axis of size 1 shards nothing, so naming one is replication.

    Args:
        layout: a ``keras.distribution.TensorLayout`` (``None``: nothing asked).
        what: how the message names the layout's use.
        batch_axis: the distribution's batch axis; default: the current distribution's, else
            the mesh's first axis (Keras' default).

    Raises:
        NotImplementedError: ``layout`` shards another dimension, or over another axis.
    """
    if layout is None:
        return
    batch_axis = batch_axis or _current_batch_axis(layout)
    mesh = layout.device_mesh
    sizes = {} if mesh is None else dict(zip(mesh.axis_names, mesh.shape))
    for dim, axis in enumerate(layout.axes):
        if axis is None or sizes.get(axis) == 1 or (dim == 0 and axis == batch_axis):
            continue
        raise NotImplementedError(
            f"{what} shards dimension {dim} over the mesh axis {axis!r}: keras.distribution on the TensorFlow "
            f"backend (smdist_tf) is data parallel only; layouts may replicate, or shard dimension 0 over the batch "
            f"axis {batch_axis!r}. For optimizer-state sharding use "
            "smdist_tf.DataParallelStrategy(shard_optimizer_state=True) (docs/sharding.md).")


def require_data_parallel(distribution: Any) -> None:
    """Raises ``NotImplementedError`` unless ``distribution`` is data parallel (see the module's docstring)."""
    import keras

    if isinstance(distribution, keras.distribution.DataParallel):
        return
    if not isinstance(distribution, keras.distribution.ModelParallel):
        raise NotImplementedError(f"{distribution}: keras.distribution on the TensorFlow backend (smdist_tf) runs "
                                  "DataParallel, and ModelParallel whose layouts ask for no more")
    layout_map = distribution._layout_map
    for key in layout_map:
        require_data_parallel_layout(layout_map[key], f"ModelParallel's layout {key!r} {layout_map[key]}",
                                     distribution.batch_dim_name)


def make_current(distribution: Any) -> None:
    """Sets the job's strategy globally for ``distribution``, or unsets it for ``None``."""
    global _set_strategy
    # Compared with what TensorFlow has set, not only with _set_strategy: keras.utils.clear_session()
    # resets TensorFlow's default graph, and the global strategy with it.
    if distribution is None:
        if _set_strategy is not None and tf.distribute.get_strategy() is _set_strategy:
            tf.distribute.experimental_set_strategy(None)
        _set_strategy = None
        return
    require_data_parallel(distribution)
    strategy = job_strategy()
    if tf.distribute.get_strategy() is not strategy:
        tf.distribute.experimental_set_strategy(strategy)
    _set_strategy = strategy


def patch_distribution_activation() -> None:
    """Wraps Keras' ``global_state.set_global_attribute`` so a distribution becoming current calls ``make_current``."""
    global_state = _compat.keras_global_state()
    keras_set_global_attribute = global_state.set_global_attribute
    distribution_attribute = _compat.keras_distribution_attribute()

    def set_global_attribute(name: str, value: Any) -> None:
        if name == distribution_attribute:
            make_current(value)  # raises before Keras stores a distribution it cannot run
        keras_set_global_attribute(name, value)

    global_state.set_global_attribute = set_global_attribute
