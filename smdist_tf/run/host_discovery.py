"""``--host-discovery-script``: ask a user script which hosts (and slots) the job may use now.

The script is horovodrun's: an executable that prints one ``host:slots`` line per
available host (``host`` alone gets ``--slots-per-host`` slots). smdistrun runs it
before every start of the job, so a restart uses the hosts that are there at that
moment; with fewer than ``--min-np`` slots it asks again every second until
``--elastic-timeout``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

from smdist_tf.run import hosts as hostlib
from smdist_tf.run.errors import UsageError
from smdist_tf.run.hosts import Host

SCRIPT_TIMEOUT_S = 60.0  # one run of the script
POLL_INTERVAL_S = 1.0  # between runs while too few slots are available (horovodrun's frequency)


class DiscoveryError(Exception):
    """The script failed, printed something that is not a host list, or too few slots appeared in time."""


@dataclass(frozen=True)
class Discovered:
    """The hosts to start on and how many ranks."""

    hosts: list[Host]
    np: int

    def describe(self) -> str:
        """``localhost:3 -> 3 ranks``."""
        return f"{hostlib.hosts_string(self.hosts)} -> {self.np} rank{'s' if self.np != 1 else ''}"


def parse_output(text: str, slots_per_host: int, script: str) -> list[Host]:
    """Reads the script's output: ``host:slots`` or ``host`` per line; blank lines are skipped.

    Raises:
        DiscoveryError: on a line that is not a host (checked like ``-H``) or a bad slot count.
    """
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            if "," in line:
                raise UsageError("one host per line")
            (host,) = hostlib.parse_host_string(line)
        except UsageError as e:
            raise DiscoveryError(f"host discovery script {script} printed a bad line {number}: {line!r} ({e})") from None
        name, sep, _ = line.rpartition(":")
        has_slots = bool(sep) and (":" not in name or name.startswith("["))  # as -H reads it (IPv6 aware)
        found.append(host if has_slots else Host(host.name, slots_per_host))
    return hostlib.merge_duplicates(found)


def run_script(script: str, slots_per_host: int) -> list[Host]:
    """Runs the script once and returns the hosts it lists.

    Raises:
        DiscoveryError: when it cannot be run, exits non-zero, runs longer than
            ``SCRIPT_TIMEOUT_S`` or prints a bad line.
    """
    try:
        done = subprocess.run([script], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"host discovery script {script} ran longer than {SCRIPT_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise DiscoveryError(f"cannot run host discovery script {script}: {e.strerror}") from None
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no error output"]
        raise DiscoveryError(f"host discovery script {script} exited with code {done.returncode}: {last[0]}")
    return parse_output(done.stdout, slots_per_host, script)


def choose_np(hosts: list[Host], min_np: int, max_np: int | None) -> int | None:
    """``min(max_np, slots)``, or None when the slots are fewer than ``min_np``."""
    slots = sum(h.slots for h in hosts)
    np = slots if max_np is None else min(max_np, slots)
    return np if np >= min_np else None


def discover(script: str, slots_per_host: int, min_np: int, max_np: int | None, timeout: float,
             stop: threading.Event, on_wait: Callable[[list[Host]], None] | None = None) -> Discovered | None:
    """Runs the script until it lists at least ``min_np`` slots; None if ``stop`` was set meanwhile.

    Args:
        script: the discovery script (an executable file).
        slots_per_host: slots of a host printed without ``:slots``.
        min_np: fewest ranks to start.
        max_np: most ranks to start (None: all slots).
        timeout: seconds to wait for enough slots.
        stop: set (by a signal handler) to give up at once.
        on_wait: called once with the first too-small host list, to say that we wait.

    Raises:
        DiscoveryError: the script failed, or fewer than ``min_np`` slots were listed for
            ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        hosts = run_script(script, slots_per_host)
        np = choose_np(hosts, min_np, max_np)
        if np is not None:
            return Discovered(hosts, np)
        if not waited and on_wait is not None:
            on_wait(hosts)
        waited = True
        now = time.monotonic()
        if now >= deadline:
            have = sum(h.slots for h in hosts)
            raise DiscoveryError(f"host discovery found {have} slot{'s' if have != 1 else ''} "
                                 f"({hostlib.hosts_string(hosts) or 'no hosts'}), fewer than --min-np {min_np}, "
                                 f"for {timeout:g} s (--elastic-timeout)")
        if stop.wait(min(POLL_INTERVAL_S, deadline - now)):
            return None
