"""``cslb bench``: the benchmark suite's command line, declared by :mod:`perf.command`.

``python -m perf`` runs the same command; perf never imports this package.
"""

from __future__ import annotations

from perf.command import build_parser, main

__all__ = ["build_parser", "main"]
