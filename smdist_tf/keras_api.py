"""Which Keras smdist_tf's Keras integration serves: the one ``tf.keras`` is.

TensorFlow 2.16 and later make ``tf.keras`` Keras 3 unless ``TF_USE_LEGACY_KERAS``
is ``1``, ``true`` or ``True`` and the ``tf-keras`` package (Keras 2) is installed.
smdist_tf follows the same rule, so a script written against ``tf.keras`` gets
callbacks, optimizers and training-loop hooks made for the Keras its models use.
Set the variable before the first ``import tensorflow``, as TensorFlow reads it once.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any

# TensorFlow's own spelling of "on" (tensorflow/python/util/lazy_loader.py).
_LEGACY_ON = ("true", "True", "1")


@functools.cache
def uses_tf_keras() -> bool:
    """True when ``tf.keras`` is Keras 2 (``tf_keras``) in this process."""
    if os.environ.get("TF_USE_LEGACY_KERAS") not in _LEGACY_ON:
        return False
    return importlib.util.find_spec("tf_keras") is not None


def keras_api() -> ModuleType:
    """The Keras package ``tf.keras`` resolves to: ``tf_keras`` or ``keras``."""
    return importlib.import_module("tf_keras" if uses_tf_keras() else "keras")


def is_tf_keras_class(cls: type) -> bool:
    """True when ``cls`` is a Keras 2 (``tf_keras``) class or a subclass of one."""
    return any(base.__module__.split(".")[0] == "tf_keras" for base in cls.__mro__)


def is_tf_keras_object(obj: Any) -> bool:
    """True when ``obj`` is an instance of a Keras 2 (``tf_keras``) class or of a subclass of one."""
    return is_tf_keras_class(type(obj))


def require_keras_3(feature: str) -> None:
    """Raises ``ValueError`` when ``tf.keras`` is Keras 2: ``feature`` is built on Keras 3.

    Args:
        feature: what the caller asked for, as the message names it.
    """
    if uses_tf_keras():
        raise ValueError(f"{feature} needs Keras 3; this process runs Keras 2 (TF_USE_LEGACY_KERAS is set and "
                         "tf-keras is installed). See docs/tf-keras.md for what smdist_tf supports on Keras 2.")
