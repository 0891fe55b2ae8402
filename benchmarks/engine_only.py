"""What the benchmarks that drive the engine without TensorFlow share: sizes on the command line, the
``mpirun`` to launch, and the run of one worker or of the driver.

Imports nothing heavy, so those benchmarks run where TensorFlow is missing (the lent GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Optional


def parse_size(text: str) -> int:
    """Parses ``4K``, ``1M``, ``64MiB`` or a plain byte count.

    Args:
        text: the size as typed on the command line.

    Returns:
        The size in bytes.
    """
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 4K, 1M, 64M")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    """Parses a comma-separated list of sizes (``1M,16M``)."""
    return [parse_size(s) for s in text.split(",") if s]


def mpirun() -> str:
    """The ``mpirun`` of ``$SMDIST_MPI_HOME``, else the one on ``PATH``."""
    home = os.environ.get("SMDIST_MPI_HOME")
    found = str(Path(home) / "bin" / "mpirun") if home else shutil.which("mpirun")
    if not found:
        raise SystemExit("no mpirun: set SMDIST_MPI_HOME or put mpirun on PATH")
    return found


def run_job(cmd: list[str], cwd: Path, env: dict, label: dict, repeat: int) -> Optional[list[dict]]:
    """Runs one mpirun job and prints its JSON lines (each with ``repeat`` added).

    Returns:
        The records, or None when the job failed (a line with ``failed`` and its output's end is printed).
    """
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(json.dumps({**label, "failed": out.stdout[-2000:] + out.stderr[-2000:]}), flush=True)
        return None
    records = [dict(json.loads(line), repeat=repeat) for line in out.stdout.splitlines() if line.startswith("{")]
    for rec in records:
        print(json.dumps(rec), flush=True)
    return records


def worker_or_driver(args: argparse.Namespace, worker: Callable[[argparse.Namespace], None],
                     drive: Callable[[argparse.Namespace], int]) -> int:
    """Runs one worker (``--worker`` given: a rank under mpirun) or the driver; the exit status."""
    if args.worker:
        worker(args)
        return 0
    return drive(args)
