"""Keras 2 (``tf_keras``) optimizers: gradients are reduced where Keras 2 aggregates them.

Keras 2 sums gradients over a strategy's replicas in one overridable step:
``aggregate_gradients`` in its optimizers, ``_aggregate_gradients`` in
``tf_keras.optimizers.legacy`` ones. ``apply_gradients`` (and so ``minimize`` and
``fit``) calls it before clipping and the update, unless told the gradients are
aggregated already; a ``LossScaleOptimizer`` calls it on the optimizer inside it before
checking the gradients for inf/NaN, and then applies with aggregation off. Reducing
there makes every rank check the same averaged gradients and take the same branch,
and reduces once whichever way the update comes.
"""

from __future__ import annotations

from typing import Any, Iterable

from smdist_tf.keras.gradient_reduction import GradientReduction


class DistributedAggregation(GradientReduction):
    """Mixed in front of a Keras 2 optimizer's class: its aggregation averages over the ranks."""

    def aggregate_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """``tf_keras.optimizers.Optimizer``'s aggregation step: the gradients reduced over the ranks."""
        return self._smdist_reduced_pairs(grads_and_vars)

    def _aggregate_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        # tf_keras.optimizers.legacy's aggregation step (listed in smdist_tf/_compat.py).
        return self._smdist_reduced_pairs(grads_and_vars)

    def _smdist_reduced_pairs(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        reduced = self._smdist_reduced([g for g, _ in pairs], variables)
        return list(zip(reduced, variables))
