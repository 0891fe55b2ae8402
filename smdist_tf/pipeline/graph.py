"""A Keras model as an ordered list of layer calls, and the tensors alive at each stage boundary."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from smdist_tf import _compat


@dataclasses.dataclass
class LayerCall:
    """One call of a layer in the model graph (a shared layer has several)."""

    layer: Any
    node: Any  # keras Node: its arguments say which tensors go where
    inputs: list[int]  # ids of the KerasTensors consumed
    outputs: list[int]  # ids of the KerasTensors produced


class ModelGraph:
    """The layer calls of a functional or Sequential model in execution order.

    Tensors are named by the ``id`` of their symbolic KerasTensor.
    """

    def __init__(self, model: keras.Model):
        functional = model
        if isinstance(model, keras.Sequential):
            functional = model._functional  # None until the Sequential knows its input
            if functional is None:
                raise ValueError("a Sequential model must start with keras.Input(...) so its layers are built")
        if not isinstance(functional, _compat.Functional) or not functional.inputs:
            raise ValueError("PipelineModel needs a Sequential or functional Keras model (subclassed models have no graph to split)")
        self.tensors: dict[int, Any] = {}
        for t in functional.inputs:
            self.tensors[id(t)] = t
        self.input_ids = [id(t) for t in functional.inputs]
        self.output_ids = [id(t) for t in functional.outputs]
        for t in functional.outputs:
            self.tensors[id(t)] = t
        self.calls: list[LayerCall] = []
        for depth in sorted(functional._nodes_by_depth, reverse=True):
            for node in functional._nodes_by_depth[depth]:
                if node.operation is None or node.is_input:
                    continue
                for t in list(node.input_tensors) + list(node.outputs):
                    self.tensors[id(t)] = t
                self.calls.append(LayerCall(node.operation, node, [id(t) for t in node.input_tensors], [id(t) for t in node.outputs]))

    def live_after(self, position: int) -> list[int]:
        """Tensors produced before call ``position`` and needed at or after it (or a model output).

        These cross the stage boundary that starts at ``position``. Model inputs
        count as produced first, so a later stage reading an input gets it passed on.
        """
        produced = list(self.input_ids)
        for call in self.calls[:position]:
            produced += call.outputs
        needed = set(self.output_ids)
        for call in self.calls[position:]:
            needed.update(call.inputs)
        seen, live = set(), []
        for t in produced:
            if t in needed and t not in seen:
                seen.add(t)
                live.append(t)
        return live

    def run(self, calls: list[LayerCall], in_ids: list[int], in_values: list, out_ids: list[int],
            training: bool) -> tuple[list, list]:
        """Executes ``calls`` on tensors ``in_values`` (named ``in_ids``).

        Returns:
            ``out_ids``' values, and the losses the calls added (activity regularizers,
            ``add_loss`` in ``call``), which the unpartitioned model would report in ``model.losses``.
        """
        values = dict(zip(in_ids, in_values))
        added = []
        for call in calls:
            args, kwargs = call.node.arguments.fill_in(values)
            if call.layer._call_has_training_arg:
                kwargs["training"] = training
            outputs = call.layer(*args, **kwargs)
            flat = keras.tree.flatten(outputs)
            for tid, value in zip(call.outputs, flat):
                values[tid] = value
            # Each call here is a top-level Keras call, which clears the layer's losses
            # first: collect them now, before a second call of a shared layer drops them.
            for layer in call.layer._flatten_layers():
                added.extend(layer._get_own_losses())
        return [values[t] for t in out_ids], added
