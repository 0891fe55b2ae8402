"""Removes the Open MPI shared-memory files a ``RayExecutor`` job left on its node when a daemon died.

Open MPI's daemon deletes each rank's ``/dev/shm`` segment when the job ends; a daemon
killed with its actor cannot. The engine sweeps such files at the next ``init()``
(``cc_ops/core/transports/mpi/stale_segments.cc``), but only those a minute old and only
when a job starts; the executor sweeps at once, after a failed run and at ``shutdown()``,
with the engine's rule (this user's segment files that no process holds open or mapped),
limited to files changed since the executor started.
"""

from __future__ import annotations

import os

SHM_DIR = "/dev/shm"
_SEGMENT_PREFIXES = ("sm_segment.", "vader_segment.")  # Open MPI 5's sm and Open MPI 4's vader BTL


def paths_in_use() -> set[str]:
    """Every path a process has open or mapped (descriptors first: a segment is opened before it is mapped)."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    used.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
            with open(f"/proc/{pid}/maps") as maps:
                used.update(line[line.index("/"):].rstrip("\n") for line in maps if "/" in line)
        except OSError:  # the process ended, or is not ours to read
            continue
    return used


def sweep_segments(since: float) -> list[str]:
    """Deletes this user's unused Open MPI segment files changed at or after ``since`` (a ``time.time()``).

    Returns:
        The paths deleted.
    """
    candidates = []
    for name in os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else []:
        path = os.path.join(SHM_DIR, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if name.startswith(_SEGMENT_PREFIXES) and st.st_uid == os.geteuid() and st.st_mtime >= since:
            candidates.append(path)
    if not candidates:
        return []
    used = paths_in_use()
    removed = []
    for path in candidates:
        if path not in used:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed
