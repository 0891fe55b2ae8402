"""Pipeline schedules: the order in which one stage runs forwards (F) and backwards (B) of microbatches."""

from __future__ import annotations

from typing import NamedTuple

SCHEDULES = ("gpipe", "1f1b")


class Action(NamedTuple):
    kind: str  # "F" or "B"
    microbatch: int


def gpipe(stage: int, num_stages: int, num_microbatches: int) -> list[Action]:
    """All forwards, then all backwards (fill–drain): every microbatch's activations are held at once."""
    del stage, num_stages
    return [Action("F", i) for i in range(num_microbatches)] + [Action("B", i) for i in range(num_microbatches)]


def one_forward_one_backward(stage: int, num_stages: int, num_microbatches: int) -> list[Action]:
    """Warm up with ``num_stages - stage - 1`` forwards, then alternate F and B, then drain.

    Stage ``s`` never holds more than ``num_stages - s`` microbatches of activations.
    """
    warmup = min(num_stages - stage - 1, num_microbatches)
    actions = [Action("F", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        actions += [Action("F", warmup + i), Action("B", i)]
    actions += [Action("B", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return actions


def build(schedule: str, stage: int, num_stages: int, num_microbatches: int) -> list[Action]:
    """The action list of ``stage`` for the named schedule."""
    if schedule == "gpipe":
        return gpipe(stage, num_stages, num_microbatches)
    if schedule == "1f1b":
        return one_forward_one_backward(stage, num_stages, num_microbatches)
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def max_in_flight(actions: list[Action]) -> int:
    """Most microbatches whose forward ran and backward did not yet (activations held)."""
    held = peak = 0
    for a in actions:
        held += 1 if a.kind == "F" else -1
        peak = max(peak, held)
    return peak


def theoretical_bubble(num_stages: int, num_microbatches: int) -> float:
    """Idle fraction of a stage for both GPipe and 1F1B: (p − 1) / (m + p − 1)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)
