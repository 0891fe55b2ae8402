"""Pipeline parallelism: ``PipelineModel``, its schedules and point-to-point messages.

``smdist_tf.keras.PipelineModel`` is the entry point; the rank helpers below read the
topology of the most recently built one (SageMaker model-parallel spelling).
"""

from smdist_tf.pipeline.model import PipelineModel
from smdist_tf.pipeline.point_to_point import recv, send
from smdist_tf.pipeline.topology import PipelineTopology, dp_group, dp_rank, dp_size, pp_group, pp_rank, pp_size

__all__ = ["PipelineModel", "PipelineTopology", "dp_group", "dp_rank", "dp_size", "pp_group", "pp_rank", "pp_size",
           "recv", "send"]
