"""What ``RayExecutor.execute`` sends to the ranks (no Ray import: it runs in the rank processes)."""

from __future__ import annotations

from typing import Any, Callable


def call_with_executable(fn: Callable[[Any], Any], executable: tuple[type, tuple, dict] | None) -> Any:
    """``fn(instance)``, the instance built from ``(cls, args, kwargs)`` in this rank; ``fn(None)`` without one."""
    if executable is None:
        return fn(None)
    cls, args, kwargs = executable
    return fn(cls(*args, **kwargs))
