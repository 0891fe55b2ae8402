"""Host lists: ``-H host:slots,...`` strings, hostfiles, and which hosts are this machine."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from smdist_tf.run.errors import UsageError

# Names every resolver treats as this machine without a lookup.
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}
# Host names reach ssh as its destination argument: a leading '-' would make one an
# option, and '@', whitespace or shell characters have no place in a name.
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
_IPV6_CHARS_RE = re.compile(r"[0-9A-Fa-f:.]+")
_RESOLVE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Host:
    """One machine of the job and how many ranks it may run."""

    name: str
    slots: int

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def _is_ipv6(name: str) -> bool:
    address = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    # The character check first: ipaddress accepts any text after '%' as a scope id.
    if not _IPV6_CHARS_RE.fullmatch(address):
        return False
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


def check_host_name(name: str, where: str) -> str:
    """Returns ``name`` if it is a host name, an IPv4 address or an (optionally bracketed) IPv6 address.

    A host name starts with a letter or digit and has only letters, digits, '.', '-' and '_'.

    Raises:
        UsageError: otherwise, saying where the name came from.
    """
    if _HOSTNAME_RE.fullmatch(name) or _is_ipv6(name):
        return name
    raise UsageError(f"bad host name {name!r} in {where}: expected a host name (letters, digits, "
                     "'.', '-', '_', not starting with '-') or an IP address")


def _check_slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise UsageError(f"bad slot count {text!r} in {where}") from None
    if slots < 1:
        raise UsageError(f"slot count must be at least 1, got {slots} in {where}")
    return slots


def parse_host_string(spec: str) -> list[Host]:
    """Parses ``-H``/``--hosts``: ``host1:4,host2:4`` (a host without ``:slots`` has one slot).

    Raises:
        UsageError: on an empty entry, a bad name or a bad slot count.
    """
    hosts = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry:
            raise UsageError(f"empty entry in host list {spec!r}")
        name, sep, slots = entry.rpartition(":")
        if not sep or ":" in name and not name.startswith("["):
            # No slot count (or a bare IPv6 address): one slot.
            name, slots = entry, "1"
        hosts.append(Host(check_host_name(name, f"host list {spec!r}"), _check_slots(slots, f"host list {spec!r}")))
    return merge_duplicates(hosts)


def parse_hostfile(path: str) -> list[Host]:
    """Parses a hostfile: one host per line as ``name slots=N`` (or ``name:N``, or just ``name``).

    ``#`` starts a comment; blank lines are skipped.

    Raises:
        UsageError: when the file is missing or a line does not have that form (the line
            number is in the message).
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read hostfile {path}: {e.strerror}") from None
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {path} line {number}"
        fields = line.split()
        if len(fields) == 1 and ":" in fields[0] and not fields[0].startswith("["):
            name, slots = fields[0].rsplit(":", 1)
        elif len(fields) == 1:
            name, slots = fields[0], "1"
        elif len(fields) == 2 and re.fullmatch(r"(slots|max_slots|max-slots)=\S+", fields[1]):
            name, slots = fields[0], fields[1].split("=", 1)[1]
        else:
            raise UsageError(f"bad {where}: {raw.strip()!r} (expected 'hostname slots=N')")
        hosts.append(Host(check_host_name(name, where), _check_slots(slots, where)))
    if not hosts:
        raise UsageError(f"hostfile {path} lists no hosts")
    return merge_duplicates(hosts)


def merge_duplicates(hosts: list[Host]) -> list[Host]:
    """Adds up the slots of a host listed twice, keeping first-seen order."""
    slots: dict[str, int] = {}
    for host in hosts:
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return [Host(name, n) for name, n in slots.items()]


def hosts_string(hosts: list[Host]) -> str:
    """The ``host:slots,...`` form both Open MPI (``-H``) and MPICH (``-hosts``) accept."""
    return ",".join(str(h) for h in hosts)


def _addresses(name: str) -> list[str]:
    infos = socket.getaddrinfo(name.strip("[]"), None, proto=socket.IPPROTO_TCP)
    return sorted({info[4][0] for info in infos})


def resolve(name: str) -> list[str]:
    """The IP addresses of ``name``; [] when it does not resolve within a few seconds."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(_addresses, name).result(timeout=_RESOLVE_TIMEOUT_S)
    except (OSError, UnicodeError, concurrent.futures.TimeoutError):
        return []
    finally:
        # A lookup stuck in the resolver must not keep the launcher waiting.
        pool.shutdown(wait=False)


def _address_is_local(address: str) -> bool:
    # Binding succeeds only for an address of one of this machine's interfaces
    # (in this network namespace), which is exactly what "local" means to MPI.
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def is_local(name: str) -> bool:
    """Whether ``name`` is this machine (loopback, our hostname, or one of our addresses)."""
    if name in _LOOPBACK_NAMES or name == socket.gethostname():
        return True
    return any(_address_is_local(a) for a in resolve(name))


def check_resolvable(hosts: list[Host]) -> None:
    """Raises UsageError naming the first host that does not resolve."""
    for host in hosts:
        if host.name not in _LOOPBACK_NAMES and not resolve(host.name):
            raise UsageError(f"unknown host {host.name!r}: it does not resolve to an address")
