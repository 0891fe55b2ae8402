"""Checks on the user-supplied values that reach mpirun's command line or environment.

Every value goes to mpirun as its own argv element, but some land inside strings that
MPI splits, or hands to a shell, again:

* Open MPI splits ``plm_ssh_args`` (the ssh port and identity file) on whitespace, and
  forwards its MCA values (that one and ``oob_tcp_if_include``) to the daemons on
  remote hosts inside a double-quoted shell command line;
* MPICH's Hydra splits ``HYDRA_LAUNCHER_EXTRA_ARGS`` (the ssh options) on spaces.

A value that lands in one of them must therefore be a single word that no shell
changes. Host names are checked in :mod:`smdist_tf.run.hosts`.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

from smdist_tf.run.errors import UsageError

# Letters, digits and _ . / + , : @ = -: no whitespace, quotes, backslash, or anything
# a shell expands inside double quotes ($, `); no '%' or '~' either, which ssh expands
# in an identity file name.
_WORD_RE = re.compile(r"[\w./+,:@=-]+")
# Linux interface names have at most 15 characters; ':' is for aliases like eth0:1.
_INTERFACE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _refuse_option_like(value: str, what: str) -> None:
    if value.startswith("-"):
        raise UsageError(f"{what} {value!r} must not start with '-' (write ./{value} for such a file)")


def check_word(value: str, what: str) -> str:
    """Returns ``value`` if it is safe inside a string MPI splits on whitespace.

    Raises:
        UsageError: when it is empty, starts with '-', or has a character outside
            letters, digits and ``_ . / + , : @ = -``.
    """
    _refuse_option_like(value, what)
    if not _WORD_RE.fullmatch(value):
        raise UsageError(f"{what} {value!r} may contain only letters, digits and _ . / + , : @ = - "
                         "(mpirun passes it on inside a string it splits on whitespace)")
    return value


def check_path(value: str, what: str) -> str:
    """Returns ``value`` if it is usable as a file name: not empty, no leading '-', no control characters.

    Raises:
        UsageError: otherwise.
    """
    if not value:
        raise UsageError(f"{what} must not be empty")
    _refuse_option_like(value, what)
    if _CONTROL_RE.search(value):
        raise UsageError(f"{what} {value!r} must not contain control characters")
    return value


def check_identity_file(value: str) -> str:
    """The absolute path (``~`` expanded) of an ssh private key that exists and is a regular file.

    The path goes into the ssh options MPI splits on whitespace, so it must also pass
    :func:`check_word`.

    Raises:
        UsageError: when it starts with '-', is not an existing regular file, or its
            absolute path has a character :func:`check_word` refuses.
    """
    check_path(value, "--ssh-identity-file")
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isfile(path):
        raise UsageError(f"--ssh-identity-file {value!r} is not an existing file")
    return check_word(path, "--ssh-identity-file path")


def check_interface(name: str) -> str:
    """Returns ``name`` if it looks like a network interface name (``eth0``, ``ib0``, ``enp1s0f0``).

    Raises:
        UsageError: otherwise.
    """
    if not _INTERFACE_RE.fullmatch(name):
        raise UsageError(f"bad network interface {name!r}: expected a name of at most 15 letters, "
                         "digits and _ . : - that starts with a letter or digit")
    return name


def check_environment(env: Mapping[Any, Any], where: str) -> None:
    """Checks extra environment variables: names are identifiers, values strings without NUL.

    Raises:
        UsageError: naming the first bad entry.
    """
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            raise UsageError(f"{where}: bad environment variable name {name!r} (expected letters, digits and _)")
        if not isinstance(value, str) or "\0" in value:
            raise UsageError(f"{where}: the value of {name} must be a string without NUL characters")
