"""Every global patch smdist_tf makes to Keras, in one registry, installed from one place.

Keras gives no public hook for what these do. Each patch changes behaviour only for
models and optimizers of smdist_tf's (a ``DistributedOptimizer`` or a
``DataParallelStrategy``); every other model keeps Keras' own methods. They are
installed together, once per process, by whatever makes one of ours:
``DataParallelStrategy()``, ``DistributedOptimizer()`` and ``load_model()``. The
``keras.distribution`` patches change what Keras' own API does, so only the explicit
``smdist_tf.keras.use_keras_distribution()`` installs them (docs/keras-distribution.md).
The private names they rely on are listed in smdist_tf/_compat.py and checked by
tests/test_compat.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from smdist_tf.keras.distribution_activation import patch_distribution_activation
from smdist_tf.keras.distribution_backend import patch_backend_distribution_lib
from smdist_tf.keras.loss_scale import patch_check_finite
from smdist_tf.keras.predict_on_batch import patch_predict_on_batch
from smdist_tf.keras.strategy_gradients import patch_gradient_reduction
from smdist_tf.keras.uneven_data import patch_training_loops
from smdist_tf.keras_api import uses_tf_keras
from smdist_tf.sharding.regather import patch_layer_call
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
    KerasPatch(
        "keras.optimizers.Optimizer._all_reduce_sum_gradients (TFOptimizer's, private)",
        "DataParallelStrategy(gradient_op=Adasum) would sum the gradients: there Keras reduces them alone, so they "
        "are combined with Adasum, everything else as before (smdist_tf/keras/strategy_gradients.py)",
        patch_gradient_reduction, keras_3_only=True),
    KerasPatch(
        "keras.layers.Layer.__call__",
        "under parameter sharding every gather of a step would run at its start and each gathered weight be kept "
        "for the backward: a layer with sharded weights gathers after its input and again for its backward "
        "(smdist_tf/sharding/regather.py)",
        patch_layer_call, keras_3_only=True),
)

KERAS_DISTRIBUTION_PATCHES = (
    KerasPatch(
        "keras.src.backend.tensorflow.distribution_lib: initialize, num_processes, process_id, list_devices, "
        "get_device_count, distribute_tensor, distribute_data_input, _to_backend_mesh, "
        "_to_backend_layout",
        "Keras' TensorFlow module is a prototype: keras.distribution.initialize() and get_device_count() fail, "
        "and a Distribution sees one process (smdist_tf/keras/distribution_backend.py)",
        patch_backend_distribution_lib, keras_3_only=True),
    KerasPatch(
        "keras.src.backend.common.global_state.set_global_attribute (for the distribution)",
        "the TensorFlow trainer looks only at tf.distribute: a current DataParallel would train each rank alone "
        "(smdist_tf/keras/distribution_activation.py)",
        patch_distribution_activation, keras_3_only=True),
)

_installed: set[str] = set()


def _install(patches: tuple) -> None:
    keras_2 = uses_tf_keras()
    for patch in patches:
        if patch.target not in _installed and not (patch.keras_3_only and keras_2):
            patch.install()
            _installed.add(patch.target)


def install_keras_patches() -> None:
    """Installs every patch the Keras ``tf.keras`` is needs, once per process (idempotent)."""
    _install(PATCHES)


def install_keras_distribution_patches() -> None:
    """Installs the patches that serve ``keras.distribution`` on TensorFlow, once per process (idempotent)."""
    _install(KERAS_DISTRIBUTION_PATCHES)


def installed_patches() -> list[str]:
    """The targets of the patches installed in this process, in registry order."""
    return [patch.target for patch in PATCHES + KERAS_DISTRIBUTION_PATCHES if patch.target in _installed]
