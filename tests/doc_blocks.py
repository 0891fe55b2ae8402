"""The code blocks of README.md and docs/*.md, and how each is run by tests/test_docs.py.

Every fenced block tagged ``python`` or ``bash`` runs as written unless an HTML comment
right above its fence (blank lines may come between) says otherwise. Comments do not
show in rendered Markdown::

    <!-- doc-test: skip (why it cannot run: a placeholder script, remote hosts, ...) -->

    <!-- doc-test: partial
    before:
    x, y = digits()             # Python run first (bash: commands), in the same process
    replace: epochs=10 => epochs=1
    after:
    assert history.history["loss"][-1] < 1.0
    -->

``partial`` completes a block: ``before:``/``after:`` take the lines that follow (up
to the next directive); each ``replace: OLD => NEW`` substitutes text in the block (it
must occur, so a stale marker fails); ``launch: python`` runs a Python block as a
script of its own with plain ``python`` (for blocks that start ranks themselves)
instead of in the file's session under ``smdistrun``. A block without a marker runs,
so a new block is tested from the moment it is written.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LANGUAGES = ("python", "bash")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"<!--\s*doc-test:\s*(skip|partial)(.*?)-->", re.S)
_DIRECTIVE = re.compile(r"^(before|after|replace|launch):\s?(.*)$")


class MarkerError(ValueError):
    """A doc-test marker that cannot be applied: its message names the file and line."""


@dataclasses.dataclass
class Completion:
    """How a ``partial`` block is completed."""

    before: str = ""
    after: str = ""
    replacements: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    launch: str = "session"  # or "python": a script of its own


@dataclasses.dataclass
class DocBlock:
    """One fenced code block: where it is, its language and text, and its marker."""

    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip_reason: str | None = None
    completion: Completion | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and self.skip_reason is None

    @property
    def launch(self) -> str:
        return self.completion.launch if self.completion else "session"

    def completed(self) -> tuple[str, str, str]:
        """(before, block with replacements applied, after).

        Raises:
            MarkerError: a replacement's text does not occur in the block.
        """
        if self.completion is None:
            return "", self.code, ""
        code = self.code
        for old, new in self.completion.replacements:
            if old not in code:
                raise MarkerError(f"{self.where}: doc-test replace: {old!r} does not occur in the block")
            code = code.replace(old, new)
        return self.completion.before, code, self.completion.after


def _parse_completion(body: str, where: str) -> Completion:
    completion = Completion()
    section: list[str] | None = None
    sections = {"before": [], "after": []}
    for raw in textwrap.dedent(body).strip("\n").splitlines():
        directive = _DIRECTIVE.match(raw.strip())
        if directive is None:
            if section is None:
                raise MarkerError(f"{where}: doc-test partial: {raw.strip()!r} is outside before:/after:")
            section.append(raw)
            continue
        name, value = directive.groups()
        if name in sections:
            section = sections[name]
            if value:
                section.append(value)
        elif name == "replace":
            if " => " not in value:
                raise MarkerError(f"{where}: doc-test replace needs 'OLD => NEW', got {value!r}")
            old, new = value.split(" => ", 1)
            completion.replacements.append((old, new))
            section = None
        else:  # launch
            if value.strip() not in ("python", "session"):
                raise MarkerError(f"{where}: doc-test launch must be 'python' or 'session', got {value!r}")
            completion.launch = value.strip()
            section = None
    completion.before = textwrap.dedent("\n".join(sections["before"]))
    completion.after = textwrap.dedent("\n".join(sections["after"]))
    if not (completion.before or completion.after or completion.replacements or completion.launch != "session"):
        raise MarkerError(f"{where}: doc-test partial says nothing about how the block is completed")
    return completion


def read_blocks(path: Path) -> list[DocBlock]:
    """Every fenced block of one Markdown file, with the marker above it applied.

    Raises:
        MarkerError: a malformed marker, a skip without a reason, a marker above no
            block, or an unclosed fence.
    """
    lines = path.read_text().splitlines()
    blocks: list[DocBlock] = []
    i = 0
    pending: tuple[int, str, str] | None = None  # (line, kind, rest) of the last marker
    while i < len(lines):
        text = lines[i]
        if "<!--" in text and "doc-test" in text:
            end = i
            while "-->" not in lines[end]:
                end += 1
                if end == len(lines):
                    raise MarkerError(f"{path}:{i + 1}: unclosed doc-test comment")
            marker = _MARKER.search("\n".join(lines[i:end + 1]))
            if marker is None:
                raise MarkerError(f"{path}:{i + 1}: doc-test marker must be 'skip (reason)' or 'partial'")
            pending = (i + 1, marker.group(1), marker.group(2))
            i = end + 1
            continue
        fence = _FENCE.match(text)
        if fence is None:
            if text.strip() and pending is not None:
                raise MarkerError(f"{path}:{pending[0]}: doc-test marker is not right above a code block")
            i += 1
            continue
        indent, language = fence.groups()
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        if i == len(lines):
            raise MarkerError(f"{path}:{start + 1}: unclosed code block")
        i += 1
        block = DocBlock(path, start + 1, language, "\n".join(body) + "\n")
        if pending is not None:
            line, kind, rest = pending
            where = f"{path.relative_to(ROOT)}:{line}"
            if kind == "skip":
                reason = re.fullmatch(r"\s*\((.+)\)\s*", rest, re.S)
                if reason is None:
                    raise MarkerError(f"{where}: doc-test skip needs a reason in parentheses")
                block.skip_reason = " ".join(reason.group(1).split())
            else:
                block.completion = _parse_completion(rest, where)
            pending = None
        blocks.append(block)
    if pending is not None:
        raise MarkerError(f"{path}:{pending[0]}: doc-test marker is not right above a code block")
    return blocks


def documentation_files() -> list[Path]:
    """README.md and docs/*.md: the Markdown a user reads."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
