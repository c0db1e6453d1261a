"""``--kernel`` (:data:`lbcore.knobs.KERNEL`) for the commands that route.

lbcore reads ``CSLB_KERNEL`` when it is imported, which a command's own imports have
done before its flags are parsed: the flag switches this process in place
(:func:`lbcore.kernel.select_kernel`) and puts the value into the environment the
command hands to the processes it starts (``cslb serve``'s gunicorn master and
workers import lbcore afresh and read it there).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import MutableMapping

from lbcore import ArgumentError
from lbcore.kernel import select_kernel, use_kernel
from lbcore.knobs import KERNEL, KnobError, add_arguments

__all__ = ["add_kernel_argument", "apply_kernel_flag"]


def add_kernel_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--kernel`` (its doc and ``CSLB_KERNEL`` in the help) to ``parser``."""
    add_arguments(parser, (KERNEL,))  # type: ignore[arg-type]


def apply_kernel_flag(
    args: argparse.Namespace,
    environ: MutableMapping[str, str],
    parser: argparse.ArgumentParser,
    *,
    switch: bool = True,
) -> None:
    """Act on ``--kernel`` if given: set ``CSLB_KERNEL`` in ``environ``, switch this process.

    ``switch=False`` for a command that routes only in the processes it starts: this
    one is left on its kernel (``native`` is still checked to load here).

    A bad value, or ``native`` where the extension cannot load, is a usage error
    (``parser.error``: status 2, the reason printed).
    """
    raw = getattr(args, KERNEL.name, None)
    if raw is None:
        return
    try:
        value = KERNEL.convert(raw, f"flag {KERNEL.flag}")
        if switch:
            with warnings.catch_warnings():
                # (auto without the extension: lbcore's import has warned once already)
                warnings.simplefilter("ignore", RuntimeWarning)
                select_kernel(value)
        elif value == "native":
            use_kernel(use_kernel("native"))
    except (KnobError, ImportError, ArgumentError) as exc:
        parser.error(str(exc) if isinstance(exc, KnobError) else f"argument {KERNEL.flag}: {exc}")
    environ[KERNEL.env] = value
