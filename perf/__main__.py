"""``python -m perf``: the benchmark suite (:func:`perf.suite.run`), as ``cslb bench``."""

import sys

from perf.command import main

sys.exit(main())
