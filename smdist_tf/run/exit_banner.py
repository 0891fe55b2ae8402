"""Open MPI's "one or more processes exited" banner, which says nothing ``smdistrun`` does not.

When a rank exits with a non-zero status, prterun (Open MPI 5) or mpirun (Open MPI 4) prints a
boxed banner of seven lines or more on its stderr, naming an internal process name and the exit
code. ``smdistrun`` names the failing rank, its host and its code in one line of its own
(``smdistrun: rank 0 (on node1) exited with code 1; the other ranks were stopped``), so it
leaves the banner out unless ``--verbose``.
"""

from __future__ import annotations

# A box's rule: a line of dashes only (Open MPI draws 74).
_MIN_RULE = 10
# The first line inside the boxes Open MPI 5 and 4 print when a process exits non-zero.
_OPENERS = (b"prterun detected that one or more processes exited",
            b"mpirun detected that one or more processes exited",
            b"Primary job  terminated normally, but")


def _is_rule(line: bytes) -> bool:
    text = line.strip()
    return len(text) >= _MIN_RULE and text == b"-" * len(text)


class ExitBannerFilter:
    """Passes lines through, leaving out the exit banners; a rule line waits for the next line."""

    def __init__(self) -> None:
        self._held: bytes | None = None
        self._in_banner = False

    def feed(self, line: bytes) -> list[bytes]:
        """The lines to write now, given the next ``line`` (with its newline)."""
        if self._in_banner:
            self._in_banner = not _is_rule(line)
            return []
        if self._held is not None:
            held, self._held = self._held, None
            if line.startswith(_OPENERS):
                self._in_banner = True
                return []
            return [held] + self.feed(line)
        if _is_rule(line):
            self._held = line
            return []
        return [line]

    def flush(self) -> list[bytes]:
        """What is still held, at the end of the stream."""
        held, self._held = self._held, None
        return [] if held is None else [held]
