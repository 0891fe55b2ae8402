"""Reads ``--config-file``: the small YAML subset launcher config files use.

Horovod-style config files are a mapping of sections (``params``, ``timeline``,
``stall_check``, ``logging``, ...) to flat ``key: value`` scalars, plus a few
top-level scalars. That subset needs no YAML library, so we parse it here
instead of adding PyYAML as a dependency:

* ``key: value`` lines; a key ending in ``:`` with nothing after it opens a section
  whose keys are indented below it (one level only);
* scalars: integers, floats, ``true/false/yes/no/on/off``, ``null``/``~``, and
  plain, single- or double-quoted strings;
* ``#`` comments and blank lines.

Anything else (lists, flow ``{...}``/``[...]`` collections, multi-line strings,
anchors) is rejected with the line number rather than misread.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from smdist_tf.run.errors import UsageError

_KEY_RE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_\-]*)\s*:(?:\s+(?P<value>.*))?$")
_TRUE = {"true", "yes", "on"}
_FALSE = {"false", "no", "off"}


def _strip_comment(line: str) -> str:
    # A '#' starts a comment unless it is inside quotes.
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def parse_scalar(text: str, where: str) -> Any:
    """Converts one YAML scalar to bool, int, float, None or str."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        body = text[1:-1]
        return body.replace("''", "'") if text[0] == "'" else body.replace('\\"', '"').replace("\\\\", "\\")
    if text[:1] in ("[", "{", "|", ">", "&", "*", "!", "-", "'", '"') and not re.fullmatch(r"-?[\d.]+(e-?\d+)?", text):
        raise UsageError(f"{where}: unsupported YAML value {text!r} (only plain scalars are understood)")
    lower = text.lower()
    if lower in _TRUE:
        return True
    if lower in _FALSE:
        return False
    if lower in ("null", "~", ""):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_config_text(text: str, source: str = "config file") -> dict[str, Any]:
    """Parses the subset described in the module docstring into nested dicts.

    Raises:
        UsageError: with the line number, on anything outside the subset.
    """
    result: dict[str, Any] = {}
    section: dict[str, Any] | None = None
    section_indent: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise UsageError(f"{source} line {number}: tabs are not allowed for indentation")
        line = _strip_comment(raw)
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        where = f"{source} line {number}"
        match = _KEY_RE.match(line)
        if not match:
            raise UsageError(f"{where}: expected 'key: value', got {raw.strip()!r}")
        indent, key, value = len(match["indent"]), match["key"].replace("-", "_"), match["value"]
        if indent == 0:
            section, section_indent = None, None
            if key in result:
                raise UsageError(f"{where}: duplicate key {key!r}")
            if value is None or not value.strip():
                section = result[key] = {}
            else:
                result[key] = parse_scalar(value, where)
            continue
        if section is None:
            raise UsageError(f"{where}: unexpected indentation")
        if section_indent is None:
            section_indent = indent
        if indent != section_indent:
            raise UsageError(f"{where}: only one level of nesting is supported")
        if value is None or not value.strip():
            raise UsageError(f"{where}: key {key!r} has no value (nested sections are not supported)")
        if key in section:
            raise UsageError(f"{where}: duplicate key {key!r}")
        section[key] = parse_scalar(value, where)
    return result


def load_config_file(path: str) -> dict[str, Any]:
    """Reads and parses ``path``; a missing file is a UsageError."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from None
    return parse_config_text(text, f"config file {path}")
