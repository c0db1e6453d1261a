"""``python -m perf``: the benchmark suite (:func:`perf.suite.run`), as ``cslb bench``."""

import sys

from cslb.bench_cmd import main

sys.exit(main())
