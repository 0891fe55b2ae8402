"""Restarting the engine on every rank with other settings, for suites that test them."""

from __future__ import annotations

import os
from typing import Any

import smdist_tf as sd


def restart_engine(process_sets: Any = None, **env: str) -> None:
    """Restarts the engine on every rank with ``process_sets`` and extra settings ('' removes one)."""
    sd.shutdown()
    for key, value in env.items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    sd.init(process_sets=process_sets)
