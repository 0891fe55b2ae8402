"""Tests that run at 2 ranks only, and why.

Every suite runs at 2 and 4 ranks. A test whose result cannot depend on the rank count (it compares two
local computations that the collectives feed alike) and that costs the most at 4 ranks, where 4 processes
share the CI machine's 2 cores, runs at 2 ranks only. Every rank skips it alike, so no collective is left
unmatched.
"""

from __future__ import annotations

import pytest

import smdist_tf as sd


def at_two_ranks_only(why: str) -> pytest.MarkDecorator:
    """Skips the test on every rank of a job of more than 2 ranks; ``why`` says why 2 ranks show it all."""
    return pytest.mark.skipif(sd.size() > 2, reason=f"shown at 2 ranks: {why}")
