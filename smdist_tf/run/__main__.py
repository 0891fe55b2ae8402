"""``python -m smdist_tf.run ...`` is the same as ``smdistrun ...``."""

import sys

from smdist_tf.run.launcher import main

sys.exit(main())
