"""Test your own distributed code: test methods and pytest functions that run on several ranks.

* :class:`DistributedTestCase` - a ``tf.test.TestCase`` whose test methods run on
  ``np`` ranks under ``smdistrun`` (``tf.test.main()``, unittest and pytest alike).
* ``@pytest.mark.distributed(np=2, timeout=120)`` - the same for a pytest test
  function (the plugin ``smdist_tf.testing.pytest_plugin`` is registered with pytest
  when smdist_tf is installed).

A failure names the rank (or ranks) it happened on; a test that does not finish
in its timeout fails, naming the ranks it was stuck on, instead of hanging.
See docs/testing.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DistributedTestCase"]


def __getattr__(name: str) -> Any:
    # Lazy: pytest loads the plugin in every session, which must not import TensorFlow.
    if name == "DistributedTestCase":
        from smdist_tf.testing.test_case import DistributedTestCase  # noqa: PLC0415

        return DistributedTestCase
    raise AttributeError(f"module 'smdist_tf.testing' has no attribute {name!r}")
