"""The on-disk home of ``smdist_tf.elastic`` commits: the directory ``SMDIST_ELASTIC_DIR`` names.

Only rank 0 reads and writes it. A commit is one pickle, ``commit-<n>.pkl``;
``manifest.json`` names the latest. Each file is written under a temporary name,
flushed to disk and renamed into place, the manifest last, and the older commit is
removed only after that, so whenever the job is killed the manifest names a
complete commit.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any, Mapping

from smdist_tf.run.restarts import ELASTIC_DIR_ENV

MANIFEST = "manifest.json"
FORMAT = 1


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sync_directory(path: Path) -> None:
    # The renames themselves must reach the disk before the old commit goes.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every filesystem syncs directories
    finally:
        os.close(fd)


class CommitStore:
    """Commits in one directory (created when the first commit is written).

    Args:
        directory: where the commits live; a directory only this job uses.
    """

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> CommitStore | None:
        """The store ``SMDIST_ELASTIC_DIR`` names (set by ``smdistrun``), or None when it is unset."""
        directory = (os.environ if environ is None else environ).get(ELASTIC_DIR_ENV)
        return cls(directory) if directory else None

    def latest(self) -> tuple[int, Any] | None:
        """``(commit number, snapshot)`` of the latest commit, or None when there is none yet.

        Raises:
            ValueError: the manifest or the commit it names cannot be read.
        """
        manifest_path = self.directory / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read {manifest_path}: {e}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"{manifest_path} is not a commit manifest of format {FORMAT}")
        path = self.directory / str(manifest["file"])
        try:
            return int(manifest["commit"]), pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError) as e:
            raise ValueError(f"cannot read commit {manifest['commit']} ({path}): {e}") from None

    def write(self, number: int, snapshot: Any) -> None:
        """Makes ``snapshot`` commit ``number``, the latest, atomically.

        Raises:
            OSError: the directory or a file could not be written.
            pickle.PicklingError, TypeError, AttributeError: ``snapshot`` has an unpicklable part.
        """
        data = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"commit-{number:08d}.pkl"
        _write_atomically(self.directory / name, data)
        manifest = {"format": FORMAT, "commit": number, "file": name, "bytes": len(data)}
        _write_atomically(self.directory / MANIFEST, json.dumps(manifest).encode())
        _sync_directory(self.directory)
        for old in self.directory.iterdir():
            # Earlier commits, and temporary files of writers that were killed.
            if old.name != name and (old.name.startswith("commit-") or old.name.startswith(f"{MANIFEST}.tmp")):
                old.unlink(missing_ok=True)
