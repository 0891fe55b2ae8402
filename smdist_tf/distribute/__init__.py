"""tf.distribute integration: ``DataParallelStrategy`` and its cross-process ops."""

from smdist_tf.distribute.checkpoint import restore_and_broadcast, save_on_rank_zero
from smdist_tf.distribute.cross_device_ops import SmdistCrossDeviceOps
from smdist_tf.distribute.strategy import DataParallelStrategy

__all__ = ["DataParallelStrategy", "SmdistCrossDeviceOps", "restore_and_broadcast", "save_on_rank_zero"]
