"""Every global patch smdist_tf makes to Keras, in one registry, installed from one place.

Keras gives no public hook for what these do. Each patch changes behaviour only for
models and optimizers of smdist_tf's (a ``DistributedOptimizer`` or a
``DataParallelStrategy``); every other model keeps Keras' own methods. They are
installed together, once per process, by whatever makes one of ours:
``DataParallelStrategy()``, ``DistributedOptimizer()`` and ``load_model()``.
The private names they rely on are listed in smdist_tf/_compat.py and checked by
tests/test_compat.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from smdist_tf.keras.loss_scale import patch_check_finite
from smdist_tf.keras.predict_on_batch import patch_predict_on_batch
from smdist_tf.keras.uneven_data import patch_training_loops
from smdist_tf.keras_api import uses_tf_keras
from smdist_tf.sharding.strategy_hook import patch_optimizer_creation


@dataclasses.dataclass(frozen=True)
class KerasPatch:
    """One global patch: what it replaces, why, and the function that installs it.

    Attributes:
        target: the Keras methods it wraps.
        why: what would go wrong without it.
        install: wraps the methods (called once per process).
        keras_3_only: Keras 2 (``tf_keras``) needs no such patch.
    """

    target: str
    why: str
    install: Callable[[], None]
    keras_3_only: bool


PATCHES = (
    KerasPatch(
        "Model.fit, Model.evaluate and Model._get_metrics_result_or_logs "
        "(tf_keras: _validate_and_get_metrics_result)",
        "a rank out of batches would meet the others' next gradient allreduce with its epoch-end collectives "
        "and hang the job: it joins instead (smdist_tf/keras/uneven_data.py)",
        patch_training_loops, keras_3_only=False),
    KerasPatch(
        "keras.optimizers.LossScaleOptimizer.check_finite",
        "one rank's overflow would send it down the other branch of the update and mis-pair the collectives: "
        "the ranks agree on finiteness first (smdist_tf/keras/loss_scale.py)",
        patch_check_finite, keras_3_only=True),
    KerasPatch(
        "keras.Model.predict_on_batch",
        "under a multi-worker strategy Keras gathers every rank's outputs, so each rank got size() copies: "
        "it predicts this rank's batch alone (smdist_tf/keras/predict_on_batch.py)",
        patch_predict_on_batch, keras_3_only=True),
    KerasPatch(
        "keras.optimizers.Optimizer.__init__",
        "an optimizer made in a sharding DataParallelStrategy's scope (compile('adam'), load_model) must be "
        "sharded before anything builds it (smdist_tf/sharding/strategy_hook.py)",
        patch_optimizer_creation, keras_3_only=True),
)

_installed: set[str] = set()


def install_keras_patches() -> None:
    """Installs every patch the Keras ``tf.keras`` is needs, once per process (idempotent)."""
    keras_2 = uses_tf_keras()
    for patch in PATCHES:
        if patch.target not in _installed and not (patch.keras_3_only and keras_2):
            patch.install()
            _installed.add(patch.target)


def installed_patches() -> list[str]:
    """The targets of the patches installed in this process, in registry order."""
    return [patch.target for patch in PATCHES if patch.target in _installed]
