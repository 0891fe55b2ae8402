"""``use_keras_distribution()``: Keras 3's ``keras.distribution`` API on the TensorFlow backend, run by smdist_tf.

See docs/keras-distribution.md. After the call, under ``smdistrun -np N``:
``keras.distribution.initialize()`` starts smdist_tf, ``list_devices()`` lists one device
per rank, and a current ``DataParallel`` (``set_distribution`` or ``scope()``) trains
``fit``/``evaluate``/``predict`` over all ranks through ``DataParallelStrategy``.
"""

from __future__ import annotations

from smdist_tf.distribute.strategy import DataParallelStrategy
from smdist_tf.keras.distribution_activation import serve_with
from smdist_tf.keras.patches import install_keras_distribution_patches
from smdist_tf.keras_api import require_keras_3


def _make_job_strategy() -> DataParallelStrategy:
    strategy = DataParallelStrategy()
    strategy.extended.serve_keras_distribution()
    return strategy


def use_keras_distribution() -> bool:
    """Serves ``keras.distribution`` on the TensorFlow backend with smdist_tf (idempotent).

    Call it once, before ``keras.distribution.initialize()``. On another Keras backend it
    does nothing, so one script runs on JAX too.

    Returns:
        True when Keras runs on TensorFlow and ``keras.distribution`` is now smdist_tf's;
        False on another backend.

    Raises:
        ValueError: ``tf.keras`` is Keras 2 (``TF_USE_LEGACY_KERAS=1``): ``keras.distribution`` is Keras 3's.
    """
    require_keras_3("keras.distribution")
    import keras

    if keras.backend.backend() != "tensorflow":
        return False
    serve_with(_make_job_strategy)
    install_keras_distribution_patches()
    return True
