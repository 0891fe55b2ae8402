"""Shards every Keras optimizer created inside a ``DataParallelStrategy(shard_optimizer_state=True)`` scope.

Keras' TensorFlow optimizers record the strategy in scope when they are made
(``TFOptimizer.__init__`` sets ``_distribution_strategy``), and must be made inside
the scope that trains with them. ``keras.optimizers.Optimizer.__init__`` is wrapped
(a public class, monkeypatched once per process by smdist_tf/keras/patches.py) to turn such an optimizer into its
sharded class right there, before anything can build it: ``compile(optimizer="adam")``,
an optimizer made by hand, and one restored by ``keras.saving.load_model`` alike.
"""

from __future__ import annotations

from typing import Any

import keras

from smdist_tf.sharding.optimizer import ShardingSettings, shard_in_place
from smdist_tf.sharding.piece_optimizer import update_pieces_in_place


def strategy_sharding(strategy: Any) -> Any:
    """The ``ShardingSettings`` of a sharding ``DataParallelStrategy``, else ``None``."""
    return getattr(strategy, "sharding_settings", None)


def patch_optimizer_creation() -> None:
    """Wraps ``keras.optimizers.Optimizer.__init__`` (installed by smdist_tf/keras/patches.py)."""
    cls = keras.optimizers.Optimizer
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        settings = strategy_sharding(self._distribution_strategy)
        # A LossScaleOptimizer (or MultiOptimizer) holds the optimizers that are sharded; Keras'
        # saving makes bare ``Optimizer`` instances for reference.
        if isinstance(settings, ShardingSettings) and type(self) is not cls and not isinstance(
                self, (keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)):
            if settings.shard_parameters:
                update_pieces_in_place(self)  # stage 3: the optimizer sees pieces, its state is per piece
            else:
                shard_in_place(self, settings)

    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__
