"""``smdistrun``: start a smdist_tf job over mpirun, on this machine or many.

``main()`` is the console script. It parses the settings and hands them to
``restarts.run_with_restarts()``, which plans and launches each attempt with
``attempt.plan()`` and ``attempt.launch()``.
"""

from __future__ import annotations

import os
import signal
import sys

from smdist_tf.run.args import parse_args
from smdist_tf.run.attempt import NotLeader, say
from smdist_tf.run.errors import UsageError
from smdist_tf.run.horovod_flags import variable_warnings
from smdist_tf.run.restarts import run_with_restarts


def main(argv: list[str] | None = None) -> int:
    """The ``smdistrun`` command. Returns the exit code (the failed rank's code on failure).

    Exit codes: 0 success; 2 bad usage (nothing was started); the first failing rank's
    code; 128+N when stopped by signal N; 1 when the ranks did not all start in time,
    or host discovery found too few slots before the first start. With restarts, the
    last attempt's code.
    """
    try:
        s = parse_args(argv)
        for line in s.warnings + variable_warnings(os.environ):
            say(sys.stderr, f"warning: {line}")
        if s.show_version:
            from smdist_tf import __version__  # noqa: PLC0415 - the parent package: smdist_tf.run imports us

            print(f"smdistrun (smdist_tf) {__version__}")
            return 0
        if s.check_build:
            from smdist_tf.run.check_build import print_check_build  # noqa: PLC0415

            return print_check_build()
        # Raises UsageError only while planning the first attempt, before anything started.
        return run_with_restarts(s).outcome.exit_code
    except UsageError as e:
        say(sys.stderr, f"error: {e}")
        return 2
    except NotLeader as e:
        say(sys.stderr, str(e))
        return 0
    except KeyboardInterrupt:  # Ctrl-C before any rank was started
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
