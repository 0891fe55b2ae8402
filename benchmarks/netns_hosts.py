"""Two "hosts" on one machine: Linux network namespaces joined by a veth pair.

Each namespace gets its own address and, through the mpirun agent script, its own hostname (UTS
namespace), so smdist_tf sees two hosts and MPI talks TCP over the veth: a real network hop
without a second machine. Used by the launcher test and by ``benchmarks/allreduce.py --two-hosts``.
Needs root, ``ip`` (iproute2) and ``unshare`` (util-linux).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

AGENT = """#!/bin/bash
# mpirun's remote agent instead of ssh: "agent HOST COMMAND..." runs COMMAND inside the
# network namespace that plays HOST, with its own hostname (UTS namespace).
host="$1"; shift
case "$host" in
  {ip_a}) ns={ns_a}; name={name_a} ;;
  {ip_b}) ns={ns_b}; name={name_b} ;;
  *) echo "netns agent: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts /bin/bash -c 'hostname "$1"; shift; eval "$*"' agent "$name" "$@"
"""


class Unavailable(RuntimeError):
    """This machine cannot build the namespaces (not root, tools missing, or not permitted)."""


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def two_namespace_hosts(workdir: str | os.PathLike | None = None) -> Iterator[dict]:
    """Builds hosts "hosta" (10.213.7.1) and "hostb" (10.213.7.2); removes them on exit.

    Yields:
        ``ns_a``/``ns_b`` (namespace names), ``ip_a``/``ip_b``, ``agent`` (the script to pass as
        ``--prtemca plm_ssh_agent``) and ``launch_prefix``: a command prefix that runs a program on
        "hosta", inside its namespace and with its hostname.

    Raises:
        Unavailable: with the reason, before anything is left behind.
    """
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root")
    for tool in ("ip", "unshare"):
        if not shutil.which(tool):
            raise Unavailable(f"'{tool}' is not installed (iproute2 / util-linux)")
    suffix = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"smdA{suffix}", f"smdB{suffix}"
    veth_a, veth_b = f"smda{suffix}", f"smdb{suffix}"
    ip_a, ip_b = "10.213.7.1", "10.213.7.2"
    made: list[str] = []
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory())
        try:
            for ns in (ns_a, ns_b):
                done = _sh("ip", "netns", "add", ns)
                if done.returncode != 0:
                    raise Unavailable(f"cannot create network namespaces here: {done.stderr.strip()}")
                made.append(ns)
            steps = [
                ("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b),
                ("ip", "link", "set", veth_a, "netns", ns_a), ("ip", "link", "set", veth_b, "netns", ns_b),
                ("ip", "-n", ns_a, "addr", "add", f"{ip_a}/24", "dev", veth_a),
                ("ip", "-n", ns_b, "addr", "add", f"{ip_b}/24", "dev", veth_b),
                ("ip", "-n", ns_a, "link", "set", veth_a, "up"), ("ip", "-n", ns_b, "link", "set", veth_b, "up"),
                ("ip", "-n", ns_a, "link", "set", "lo", "up"), ("ip", "-n", ns_b, "link", "set", "lo", "up"),
            ]
            for step in steps:
                done = _sh(*step)
                if done.returncode != 0:
                    raise Unavailable(f"cannot build the veth pair ({' '.join(step)}): {done.stderr.strip()}")
            probe = _sh("ip", "netns", "exec", ns_a, "unshare", "--uts", "true")
            if probe.returncode != 0:
                raise Unavailable(f"cannot unshare the UTS namespace: {probe.stderr.strip()}")
            agent = Path(workdir) / "netns_agent.sh"
            agent.write_text(AGENT.format(ip_a=ip_a, ip_b=ip_b, ns_a=ns_a, ns_b=ns_b, name_a="hosta", name_b="hostb"))
            agent.chmod(0o755)
            yield {
                "ns_a": ns_a, "ns_b": ns_b, "ip_a": ip_a, "ip_b": ip_b, "agent": str(agent),
                "launch_prefix": ["ip", "netns", "exec", ns_a, "unshare", "--uts", "/bin/bash", "-c",
                                  'hostname hosta; exec "$@"', "launch"],
            }
        finally:
            for ns in made:
                # Nothing may outlive the namespace, then the namespace itself goes.
                for pid in _sh("ip", "netns", "pids", ns).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                _sh("ip", "netns", "del", ns)
