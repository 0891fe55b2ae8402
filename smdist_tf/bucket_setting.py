"""``SMDIST_BUCKET_CAP_MB``, read without TensorFlow: the gradient buckets use it, and ``smdistrun``
checks it before it starts a rank (smdist_tf/run/settings_check.py)."""

from __future__ import annotations

from typing import Mapping

BUCKET_CAP_VARIABLE = "SMDIST_BUCKET_CAP_MB"
DEFAULT_BUCKET_CAP_MB = 4.0


def bucket_cap_megabytes(environ: Mapping[str, str]) -> float:
    """The bucket cap ``environ`` sets, in MiB (the default when unset).

    Raises:
        ValueError: the value is not a positive number.
    """
    text = environ.get(BUCKET_CAP_VARIABLE, "")
    try:
        megabytes = float(text) if text else DEFAULT_BUCKET_CAP_MB
    except ValueError:
        megabytes = -1.0
    if not megabytes > 0:
        raise ValueError(f"{BUCKET_CAP_VARIABLE} must be a positive number of MiB, got {text!r}")
    return megabytes
