"""Reduction operators, with the names and values Horovod users pass as ``op=``.

``Adasum`` (allreduce only, and the gradient reductions built on it) combines the ranks'
tensors pairwise up a binary tree of the ranks with the scale-invariant rule of Maleki et
al. (MLSys 2021): ``adasum(a, b) = (1 - a·b / (2‖a‖²)) a + (1 - a·b / (2‖b‖²)) b``, a
coefficient term counted as 0 where its vector is zero, each tensor with its own dot
products. It needs a power-of-two number of ranks and floating-point tensors, runs on the
host transports (GPU tensors are staged through host memory) and takes no wire
compression; see docs/migrate-from-horovod.md.
"""

from __future__ import annotations

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


def op_name(op: int) -> str:
    return _NAMES.get(op, f"unknown({op})")


def validate(op: int) -> int:
    """Returns ``op`` if it is a reduction we implement, else raises a clear error."""
    if op not in _NAMES:
        raise ValueError(f"unknown reduction op {op!r}; use smdist_tf.Average, Sum, Adasum, Min, Max or Product")
    return op
