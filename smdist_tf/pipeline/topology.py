"""How the world splits into pipeline stages and data-parallel replicas."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class PipelineTopology:
    """Rank layout of ``size = pp_size × dp_size`` processes.

    A pipeline's stages are adjacent ranks: ``rank = dp_rank * pp_size + pp_rank``.
    So with 4 ranks and 2 stages, ranks 0→1 form one pipeline and 2→3 the other,
    and each stage's data-parallel group is ``{pp_rank, pp_rank + pp_size, ...}``.
    """

    rank: int
    size: int
    pp_size: int

    def __post_init__(self) -> None:
        if self.pp_size < 1:
            raise ValueError(f"num_stages must be at least 1, got {self.pp_size}")
        if self.size % self.pp_size != 0:
            raise ValueError(
                f"the world size {self.size} is not a multiple of num_stages={self.pp_size}: "
                f"launch num_stages × data-parallel replicas processes"
            )

    @property
    def dp_size(self) -> int:
        return self.size // self.pp_size

    @property
    def pp_rank(self) -> int:
        return self.rank % self.pp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.pp_size

    @property
    def pp_group(self) -> list[int]:
        """Ranks of this rank's pipeline, first stage first."""
        base = self.dp_rank * self.pp_size
        return list(range(base, base + self.pp_size))

    @property
    def dp_group(self) -> list[int]:
        """Ranks holding the same stage as this rank (its data-parallel replicas)."""
        return list(range(self.pp_rank, self.size, self.pp_size))

    def stage_rank(self, stage: int) -> int:
        """The rank running ``stage`` in this rank's pipeline."""
        return self.dp_rank * self.pp_size + stage


_current: Optional[PipelineTopology] = None


def set_current(topology: PipelineTopology) -> None:
    global _current
    _current = topology


def current() -> PipelineTopology:
    """The topology of the most recently built :class:`PipelineModel`."""
    if _current is None:
        raise RuntimeError("no PipelineModel has been built yet: the pipeline rank helpers need one")
    return _current


def pp_rank() -> int:
    """This rank's pipeline stage."""
    return current().pp_rank


def pp_size() -> int:
    """Number of pipeline stages."""
    return current().pp_size


def dp_rank() -> int:
    """This rank's index among the replicas of its stage."""
    return current().dp_rank


def dp_size() -> int:
    """Number of data-parallel replicas of each stage."""
    return current().dp_size


def pp_group() -> list[int]:
    """Ranks of this rank's pipeline, in stage order."""
    return current().pp_group


def dp_group() -> list[int]:
    """Ranks that hold this rank's stage."""
    return current().dp_group
