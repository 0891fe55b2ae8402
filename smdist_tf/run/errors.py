"""The one exception type the launcher turns into a one-line message and exit code 2."""


class UsageError(Exception):
    """Bad command line, host list, hostfile or config file: nothing has been started.

    ``launcher.main`` prints ``smdistrun: error: <message>`` on one line and exits with 2,
    the same code argparse uses, so scripts can tell a usage problem from a failed job.
    """
