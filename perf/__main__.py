"""``python -m perf``: the benchmark suite (see :mod:`perf.suite`)."""

import sys

from perf.suite import main

sys.exit(main())
