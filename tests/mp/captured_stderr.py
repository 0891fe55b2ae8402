"""``CapturedStderr``: what the C++ engine logs (file descriptor 2) while a block runs."""

from __future__ import annotations

import os
import tempfile


class CapturedStderr:
    """Captures file descriptor 2, where the C++ engine logs; ``text`` holds it after the block."""

    def __enter__(self) -> "CapturedStderr":
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()
