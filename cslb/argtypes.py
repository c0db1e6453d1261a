"""argparse option types from lbcore's range-checked parsers (:mod:`lbcore.knobs`).

Every number a command line takes is checked by the parser the settings use; this only
turns its ``ValueError`` into argparse's error, which names the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from lbcore.knobs import parse_int_between, parse_number_between

__all__ = ["integer", "number", "option_type"]

T = TypeVar("T")


def option_type(parse: Callable[[str], T], detail: str = "") -> Callable[[str], T]:
    """``parse`` as an argparse ``type``: its message, then ``detail``, then what was given.

    Parameters
    ----------
    parse
        A parser that raises ``ValueError`` saying what it expected.
    detail
        Text after the expectation (a unit, or why the bound is there).
    """

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}{detail}, got {text!r}") from None

    return convert


def integer(low: int, high: int | None = None, detail: str = "") -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` (``None``: no upper bound)."""
    return option_type(parse_int_between(low, high), detail)


def number(low: float, *, above: bool = False, detail: str = "") -> Callable[[str], float]:
    """A finite number ``>= low`` (``> low`` with ``above``)."""
    return option_type(parse_number_between(low, above=above), detail)
