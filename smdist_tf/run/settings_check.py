"""``smdistrun`` refuses malformed engine settings before it starts anything.

Every rank's ``init()`` refuses a malformed ``SMDIST_*``/``HOROVOD_*`` value, but only after
the rank has imported TensorFlow (about 11 s on this project's 2-core machine). The
launcher checks the job's environment first, with the same rules: the engine's own parser
(cc_ops/core/common/config.cc, through the runtime module, which needs neither TensorFlow nor
a started engine) and ``SMDIST_BUCKET_CAP_MB``'s (smdist_tf/bucket_setting.py).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from smdist_tf.bucket_setting import bucket_cap_megabytes

_PREFIXES = ("SMDIST_", "HOROVOD_")


def settings_error(env: Mapping[str, str]) -> Optional[str]:
    """What the ranks would refuse in ``env`` (the job's environment), or None."""
    try:
        bucket_cap_megabytes(env)
    except ValueError as e:
        return str(e)
    from smdist_tf import _runtime  # noqa: PLC0415 - the bindings alone: no TensorFlow

    # The parser reads this process's environment: give it the job's settings for the call.
    saved = {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
    try:
        for name in saved:
            del os.environ[name]
        os.environ.update({k: v for k, v in env.items() if k.startswith(_PREFIXES)})
        return _runtime.environment_config_error() or None
    finally:
        for name in [k for k in os.environ if k.startswith(_PREFIXES)]:
            del os.environ[name]
        os.environ.update(saved)
