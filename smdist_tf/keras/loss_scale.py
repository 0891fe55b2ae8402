"""Makes Keras' LossScaleOptimizer agree across ranks on whether gradients are finite.

LossScaleOptimizer checks ``isfinite`` on this rank's gradients and then takes one
of two ``tf.cond`` branches, only one of which communicates. If a single rank
overflows, ranks would take different branches and their collectives would
mis-pair (or hang). We AND the flag over the ranks that reduce together (all, or
the optimizer's process set) with an allreduce-MIN first.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from smdist_tf.collectives import allreduce
from smdist_tf.reduce_ops import Min
from smdist_tf.runtime import size
from smdist_tf.strategy_kind import OneReplicaPerRank


def _reducing_ranks(optimizer: Any) -> tuple[bool, Any]:
    """Whether this LossScaleOptimizer's branches issue collectives, and over which process set."""
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, OneReplicaPerRank):
        return True, strategy.process_set
    inner = getattr(optimizer, "inner_optimizer", None)
    if getattr(inner, "_smdist_reduces_in_apply", False):
        return True, inner.smdist_process_set
    return False, None


def patch_check_finite() -> None:
    """Wraps ``keras.optimizers.LossScaleOptimizer.check_finite`` (installed by smdist_tf/keras/patches.py)."""
    import keras

    cls = keras.optimizers.LossScaleOptimizer
    local_check = cls.check_finite

    def check_finite(self: Any, grads: Any) -> Any:
        finite = local_check(self, grads)
        reduces, process_set = _reducing_ranks(self)
        if reduces and size() > 1:
            agreed = allreduce(tf.cast(finite, tf.int32), op=Min, name=None, process_set=process_set)
            finite = tf.greater(agreed, 0)
        return finite

    check_finite.__doc__ = local_check.__doc__
    cls.check_finite = check_finite
