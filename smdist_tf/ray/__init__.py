"""smdist_tf jobs on a Ray cluster: ``RayExecutor``, with ``horovod.ray.RayExecutor``'s spelling.

Needs ``ray`` (pinned in requirements.txt); see docs/ray.md. The names are resolved on
first use: the ranks import ``smdist_tf.ray.calls`` without loading Ray.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RayExecutor", "RayRunError", "RaySettings"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from smdist_tf.ray import executor  # noqa: PLC0415 - imports Ray

        return getattr(executor, name)
    raise AttributeError(f"module 'smdist_tf.ray' has no attribute {name!r}")
