"""Reads ``--config-file``: horovodrun's YAML launcher config files, with PyYAML.

Horovod-style config files are a mapping of sections (``params``, ``timeline``,
``stall_check``, ``logging``, ...) to flat ``key: value`` scalars, plus a few
top-level scalars. The file is parsed with ``yaml.safe_load`` rules; what the
launcher cannot use is rejected with the line number rather than misread: a
document that is not such a mapping, deeper nesting, lists, and keys given twice
(which YAML itself would let the last one win). Dashes in keys read as
underscores (``mpi-args`` is ``mpi_args``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from smdist_tf.run.errors import UsageError


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _checked_mapping(node: yaml.Node, source: str, depth: int) -> dict[str, yaml.Node]:
    """The mapping's keys (dashes as underscores) to their value nodes; nothing but scalar keys, once each."""
    if not isinstance(node, yaml.MappingNode):
        what = "a list" if isinstance(node, yaml.SequenceNode) else "a value"
        raise UsageError(f"{source} line {_line(node)}: expected 'key: value' entries, got {what}")
    entries: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise UsageError(f"{source} line {_line(key_node)}: keys must be plain names")
        key = str(key_node.value).replace("-", "_")
        if key in entries:
            raise UsageError(f"{source} line {_line(key_node)}: duplicate key {key!r}")
        if isinstance(value_node, yaml.SequenceNode):
            raise UsageError(f"{source} line {_line(value_node)}: {key!r} is a list; only scalars are understood")
        if isinstance(value_node, yaml.MappingNode):
            if depth > 0 or value_node.flow_style:
                raise UsageError(f"{source} line {_line(key_node)}: only one level of 'section:' followed by "
                                 "indented 'key: value' lines is supported")
            _checked_mapping(value_node, source, depth + 1)
        entries[key] = value_node
    return entries


def parse_config_text(text: str, source: str = "config file") -> dict[str, Any]:
    """Parses a launcher config into ``{key: scalar}`` and ``{section: {key: scalar}}``.

    Raises:
        UsageError: with the line number, on malformed YAML or anything the launcher cannot use.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is None:
            return {}
        _checked_mapping(root, source, 0)
        # Checked: now build the values with safe_load's rules, keys as the launcher spells them.
        loaded = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{source}{line}: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{source}: {e}") from None
    return {str(k).replace("-", "_"): ({str(sk).replace("-", "_"): sv for sk, sv in v.items()}
                                        if isinstance(v, dict) else v)
            for k, v in loaded.items()}


def load_config_file(path: str) -> dict[str, Any]:
    """Reads and parses ``path``; a missing file is a UsageError."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from None
    return parse_config_text(text, f"config file {path}")
