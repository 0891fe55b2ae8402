"""Keras 2 arguments that Horovod's own Keras examples pass and Keras 3 refuses, dropped with one warning.

Horovod's ``tensorflow2_keras_mnist.py`` and ``tensorflow2_keras_synthetic_benchmark.py`` call
``model.compile(..., experimental_run_tf_function=False)``; Keras 3's ``compile`` has no such
argument (``TypeError``). It only told Keras 2 to run the step as a ``tf.function``, which Keras 3
always does, so dropping it changes nothing. Installed once a Keras 3 ``DistributedOptimizer``
is made, which such a script does before ``compile``.
"""

from __future__ import annotations

import warnings

import keras

from smdist_tf import _compat

DROPPED = {
    "experimental_run_tf_function": (
        "smdist_tf: compile(experimental_run_tf_function=...) is a Keras 2 argument that Keras 3 refuses; "
        "smdist_tf drops it (Keras 3 always runs the step as a tf.function). Remove it from the call "
        "(docs/migrate-from-horovod.md)."),
}
_installed = False
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


def install_keras2_compile_arguments() -> None:
    """Lets Keras 3's ``Model.compile`` take (and drop) the arguments in ``DROPPED``; idempotent."""
    global _installed
    if not _installed:
        _compat.drop_compile_arguments(keras.Model, DROPPED, _warn_once)
        _installed = True
