"""``OneReplicaPerRank``: the kind of ``tf.distribute`` strategy whose replicas are smdist_tf's ranks.

``DataParallelStrategy`` is one. Keras' patches (smdist_tf/keras/patches.py) and
``DistributedOptimizer`` ask a model's strategy whether it is one through this class,
not the strategy's own module, which installs those patches: imports run one way.
"""

from __future__ import annotations

from typing import Optional

from smdist_tf.process_sets import ProcessSet


class OneReplicaPerRank:
    """A ``tf.distribute.Strategy`` with one replica per smdist_tf process (mixed in first)."""

    @property
    def process_set(self) -> Optional[ProcessSet]:
        """The ``ProcessSet`` the strategy trains over, or ``None`` for all ranks."""
        raise NotImplementedError

    @property
    def gradient_op(self) -> int:
        """How the optimizer's gradients are combined: ``Average`` or ``Adasum`` (``smdist_tf.reduce_ops``)."""
        raise NotImplementedError
