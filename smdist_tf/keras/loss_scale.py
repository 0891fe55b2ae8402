"""Makes Keras' LossScaleOptimizer agree across ranks on whether gradients are finite.

LossScaleOptimizer checks ``isfinite`` on this rank's gradients and then takes one
of two ``tf.cond`` branches, only one of which communicates. If a single rank
overflows, ranks would take different branches and their collectives would
mis-pair (or hang). We AND the flag over all ranks (allreduce-MIN) first.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from smdist_tf.collectives import allreduce
from smdist_tf.reduce_ops import Min
from smdist_tf.runtime import size

_installed = False


def _spans_ranks(optimizer: Any) -> bool:
    """True when this LossScaleOptimizer's branches issue collectives over all ranks."""
    from smdist_tf.distribute.strategy import DataParallelStrategy

    if isinstance(tf.distribute.get_strategy(), DataParallelStrategy):
        return True
    return bool(getattr(getattr(optimizer, "inner_optimizer", None), "_smdist_reduces_in_apply", False))


def install_finite_agreement() -> None:
    """Patches ``keras.optimizers.LossScaleOptimizer.check_finite`` once per process (idempotent)."""
    global _installed
    if _installed:
        return
    import keras

    cls = keras.optimizers.LossScaleOptimizer
    local_check = cls.check_finite

    def check_finite(self: Any, grads: Any) -> Any:
        finite = local_check(self, grads)
        if size() > 1 and _spans_ranks(self):
            agreed = allreduce(tf.cast(finite, tf.int32), op=Min, name=None)
            finite = tf.greater(agreed, 0)
        return finite

    check_finite.__doc__ = local_check.__doc__
    cls.check_finite = check_finite
    _installed = True
