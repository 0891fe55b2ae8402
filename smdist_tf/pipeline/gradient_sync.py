"""Averaging stage gradients over data-parallel replicas and summing tied weights over stages.

A variable's gradient is summed over every rank holding it — the ``d`` replicas of
each stage that uses it — and divided by ``d``: the replica average, summed over the
stages of a tied weight. The sums run within those groups only (see
:mod:`smdist_tf.pipeline.exchange`), so a rank moves and holds its own stage's
gradients, never a buffer covering the whole model.
"""

from __future__ import annotations

from smdist_tf.pipeline.exchange import GroupPlan


class GradientSync:
    """Makes each stage's gradients those of the unpartitioned model on the global batch."""

    def __init__(self, plan: GroupPlan, dp_size: int):
        """Args:
            plan: the groups of this rank's trainable variables, indexed like the stage's variables.
            dp_size: replicas of each stage.
        """
        self.plan, self.dp_size = plan, dp_size
        self.needed = plan.needed

    def __call__(self, grads: list) -> list:
        """Returns the synchronised gradients, in the order of the stage's variables."""
        if not self.needed:
            return grads
        return self.plan.reduce(grads, postscale=1.0 / self.dp_size, name="pipeline.gradients")
