"""Keras' automatic XLA on a GPU, where this build lowers the collectives for the CPU only.

Keras 3 resolves ``jit_compile="auto"`` to True on a machine with a GPU when the model has
no ``tf.distribute`` strategy, so the train step of a model compiled with
``DistributedOptimizer`` (the Horovod script) goes to XLA for the GPU, collectives included.
The GPU variant lowers them for ``XLA_GPU_JIT`` too; the CPU variant only for ``XLA_CPU_JIT``,
where XLA would stop the first step at "no registered OpKernel for XLA_GPU_JIT". ``fit`` then
trains that model without XLA instead, with one warning that names the fix.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import tensorflow as tf

from smdist_tf._native import build_info
from smdist_tf.keras.gradient_reduction import GradientReduction
from smdist_tf.sharding.optimizer import ShardedApply


def lowered_xla_devices(info: dict = build_info) -> tuple[str, ...]:
    """The device kinds this build lowers the collectives to XLA for."""
    return ("CPU", "GPU") if info.get("gpu_kernels") else ("CPU",)


def visible_gpus() -> list:
    """The GPUs TensorFlow sees."""
    return tf.config.list_physical_devices("GPU")


def _reduces_with_smdist(optimizer: Any) -> bool:
    """True for a DistributedOptimizer (also inside a LossScaleOptimizer)."""
    while optimizer is not None:
        if isinstance(optimizer, (GradientReduction, ShardedApply)):
            return True
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return False


def keep_jit_compile_where_lowered(model: Any, gpus: Sequence[Any] | None = None,
                                   lowered: Sequence[str] | None = None) -> bool:
    """Turns ``model.jit_compile`` off when XLA would compile our collectives for a GPU they have no lowering for.

    Args:
        model: the Keras model ``fit`` is about to train.
        gpus: the GPUs TensorFlow sees (default: ``visible_gpus()``).
        lowered: the device kinds the collectives lower for (default: this build's).

    Returns:
        True when it turned XLA off for this model (and warned).
    """
    if not getattr(model, "jit_compile", False) or not _reduces_with_smdist(getattr(model, "optimizer", None)):
        return False
    lowered = lowered_xla_devices() if lowered is None else lowered
    gpus = visible_gpus() if gpus is None else gpus
    if not gpus or "GPU" in lowered:
        return False
    model.jit_compile = False
    warnings.warn(
        f"smdist_tf: model '{model.name}' would train with XLA on the GPU (Keras turns jit_compile on by itself "
        f"where there is a GPU), but this smdist_tf build lowers its collectives to XLA for the CPU only; training it "
        f"without XLA. Fix: build the GPU variant (`SMDIST_GPU=1 bash scripts/bootstrap.sh`, or "
        f"`-DSMDIST_GPU_KERNELS=ON` with the `tensorflow` package; see docs/gpus.md), or pass jit_compile=False to "
        f"compile() to silence this.", stacklevel=3)
    return True
