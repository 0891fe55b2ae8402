"""Launching smdist_tf jobs: the ``smdistrun`` command and ``smdist_tf.run(fn, ...)``.

``smdist_tf.run`` is at once this package (``python -m smdist_tf.run``,
``smdist_tf.run.launcher``) and the function that runs ``fn`` on every rank:
the module object's class is switched to a callable module type, so
``smdist_tf.run(fn, np=2)`` and ``import smdist_tf.run.launcher`` both work and
neither shadows the other (binding a function named ``run`` on the parent
package would hide the subpackage's modules from attribute access).

The launcher's modules use only the standard library; importing them runs
``smdist_tf/__init__``, which resolves its TensorFlow-bound names lazily and so
loads no TensorFlow. The per-rank agent and the ``smdist_tf.run`` rank entry are
started by file path, so a rank pays for no import it does not make itself.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from smdist_tf.run.errors import UsageError
from smdist_tf.run.launcher import main
from smdist_tf.run.programmatic import RunError, run

__version__ = "0.1.0"
__all__ = ["RunError", "UsageError", "main", "run"]


class _CallableModule(types.ModuleType):
    """``smdist_tf.run(...)`` calls :func:`smdist_tf.run.programmatic.run`."""

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return run(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
# inspect.signature() and help() of the callable module show run()'s real parameters,
# not __call__'s pass-through (fn, *args, **kwargs).
__signature__ = inspect.signature(run)
__doc__ = f"{__doc__}\nCalling it: ``smdist_tf.run{__signature__}``\n\n{inspect.getdoc(run)}\n"
