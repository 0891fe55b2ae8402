"""Reduction operators, with the names and values Horovod users pass as ``op=``."""

from __future__ import annotations

Average = 0
Sum = 1
Adasum = 2  # accepted name, not implemented: passing it raises NotImplementedError
Min = 3
Max = 4
Product = 5

_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


def op_name(op: int) -> str:
    return _NAMES.get(op, f"unknown({op})")


def validate(op: int) -> int:
    """Returns ``op`` if it is a reduction we implement, else raises a clear error."""
    if op == Adasum:
        raise NotImplementedError("smdist_tf does not implement Adasum; use Average or Sum")
    if op not in _NAMES:
        raise ValueError(f"unknown reduction op {op!r}; use smdist_tf.Average, Sum, Min, Max or Product")
    return op
