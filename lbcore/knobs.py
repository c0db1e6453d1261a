"""Runtime knobs, each declared once: environment variable, CLI flag, default, validation, docs.

Like gunicorn's settings, a knob is one small declaration, and everything else — the
``argparse`` options, reading ``CSLB_*`` variables, reading a ConfigMap's data, the docs
table in the README — is derived from the declarations, so code, ``--help`` and docs
cannot disagree. This module declares the *routing* knobs (the ones published with the
tables so every worker of a host flips at the same generation); other rooms declare
their own process settings with the same :class:`Knob` type.

Besides the routing knobs, two kinds of process settings are declared here because
they are lbcore's or because every room reads them: :data:`KERNEL` and the log settings
(:data:`LOG_FORMAT`, :data:`LOG_LEVEL`).

Pure: values come in as mappings and strings; nothing here reads the environment itself.
(The one setting lbcore reads from the environment, :data:`KERNEL`, is read by
:mod:`lbcore.kernel` when lbcore is imported; the log settings are read by the process
that writes the lines.)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lbcore.errors import LBCoreError
from lbcore.signals import LOAD_SIGNALS

__all__ = [
    "FADE_MODES",
    "KERNEL",
    "KERNELS",
    "LOG_FORMAT",
    "LOG_FORMATS",
    "LOG_KNOBS",
    "LOG_LEVEL",
    "LOG_LEVELS",
    "MAX_KNOB_MAGNITUDE",
    "MAX_SECONDS",
    "ROUTING_KNOBS",
    "Knob",
    "KnobError",
    "add_arguments",
    "defaults",
    "docs_table",
    "from_args",
    "from_mapping",
    "knob",
    "parse_bool",
    "parse_choice",
    "parse_int_between",
    "parse_number_between",
    "parse_seconds",
    "seconds_at_least",
]

#: Fade-in mechanisms: cslb's N-ring fade-in, Skipper's probabilistic one, or none.
FADE_MODES = ("n-ring", "skipper", "off")

#: Longest duration any knob takes, in seconds (seven days). Durations become int64
#: nanoseconds added to CLOCK_MONOTONIC, ``poll`` timeouts in int milliseconds and
#: ``time.sleep`` arguments; this bound keeps every one of them in range.
MAX_SECONDS = 7 * 86400.0

#: Largest magnitude of any numeric knob value: what a C ``int`` holds. Each parser has
#: its own, usually tighter, range; :meth:`Knob.convert` refuses anything beyond this
#: whatever the parser said, so no knob can overflow the code that uses it.
MAX_KNOB_MAGNITUDE = (1 << 31) - 1


class KnobError(LBCoreError, ValueError):
    """A knob value cannot be parsed or is out of range; the message names the knob."""


@dataclass(frozen=True, slots=True)
class Knob:
    """One setting: where it comes from, its default, how it is checked, what it means.

    Parameters
    ----------
    name
        Python name (``balance_factor``); the key in value dictionaries.
    env
        Environment variable (``CSLB_BALANCE_FACTOR``); also accepted as a ConfigMap key.
    flag
        Command-line flag (``--balance-factor``).
    default
        Value when nothing sets it.
    parse
        Turns a string (environment, flag, ConfigMap) into a value; raises ``ValueError``
        with a message saying what was expected.
    doc
        One paragraph for ``--help`` and the README.
    metavar
        Placeholder shown in ``--help``.
    auto
        The default is worked out at run time (``default`` is its placeholder, such as
        ``0``): shown as ``auto`` in ``--help`` and the README.
    """

    name: str
    env: str
    flag: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    metavar: str = "VALUE"
    auto: bool = False

    @property
    def shown_default(self) -> str:
        """The default as ``--help`` and the README show it: ``auto``, ``-`` when empty."""
        if self.auto:
            return "auto"
        if self.default is None or self.default == "":
            return "-"
        return _typed_to_str(self.default)

    def convert(self, raw: Any, source: str) -> Any:
        """Parse and validate ``raw`` (a string, or an already typed value)."""
        try:
            value = self.parse(raw if isinstance(raw, str) else _typed_to_str(raw))
            _check_magnitude(value)
        except (TypeError, ValueError, OverflowError) as exc:
            shown = repr(raw) if len(repr(raw)) <= 80 else repr(raw)[:77] + "..."
            raise KnobError(f"{source}: invalid {self.env}={shown}: {exc}") from None
        return value


def _check_magnitude(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not (math.isfinite(value) and abs(value) <= MAX_KNOB_MAGNITUDE):
        raise ValueError(f"expected a finite number of magnitude at most {MAX_KNOB_MAGNITUDE}")


def _typed_to_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


# --------------------------------------------------------------------------------------
# Parsers. Each raises ValueError saying what it expected.


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case)."""
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _number(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


def parse_int_between(low: int, high: int | None = None) -> Callable[[str], int]:
    """A parser of an integer from ``low`` to ``high`` (``None``: no upper bound).

    ``_`` separators are allowed.
    """
    if high is None:
        expected = f"expected an integer >= {low}"
    else:
        expected = f"expected an integer from {low} to {high}"

    def parse(text: str) -> int:
        t = text.strip().replace("_", "")
        # int() of a huge digit string is slow and may raise past Python's digit limit.
        if len(t) > 24:
            raise ValueError(expected)
        try:
            value = int(t)
        except ValueError:
            raise ValueError(expected) from None
        if value < low or (high is not None and value > high):
            raise ValueError(expected)
        return value

    return parse


def parse_number_between(
    low: float,
    high: float | None = None,
    *,
    above: bool = False,
    what: str = "a finite number",
    suffix: str = "",
) -> Callable[[str], float]:
    """A parser of a finite number from ``low`` to ``high`` (``None``: no upper bound).

    Parameters
    ----------
    low, high
        The range, both ends included (``low`` excluded with ``above``).
    above
        The number must be greater than ``low``.
    what
        What the message says was expected (``"a percentage"``).
    suffix
        A unit the text may end with, dropped before parsing (``"%"``).
    """
    if high is not None:
        expected = f"expected {what} from {low:g} to {high:g}"
    else:
        expected = f"expected {what} {'>' if above else '>='} {low:g}"

    def parse(text: str) -> float:
        t = text.strip()
        if suffix:
            t = t.removesuffix(suffix).strip()
        try:
            value = float(t)
        except ValueError:
            raise ValueError(expected) from None
        in_range = value > low if above else value >= low
        if not (math.isfinite(value) and in_range and (high is None or value <= high)):
            raise ValueError(expected)
        return value

    return parse


def _percentage(text: str) -> float:
    value = _number(text.strip().rstrip("%"))
    if not 0.0 <= value <= 100.0:
        raise ValueError("expected a percentage from 0 to 100")
    return value


def _balance_factor(text: str) -> float | None:
    if text.strip().lower() in ("none", "off", ""):
        return None
    value = _number(text)
    if value < 1.0:
        raise ValueError("expected a number >= 1 (or 'off' for no load bound)")
    if value > MAX_BALANCE_FACTOR:
        raise ValueError(
            f"expected a number from 1 to {MAX_BALANCE_FACTOR:g} (or 'off' for no load bound)"
        )
    return value


#: Largest balance factor: beyond it the bound never binds ('off' says that plainly).
MAX_BALANCE_FACTOR = 1000.0

#: Largest bounded-load walk: a walk never visits more endpoints than a table holds.
MAX_HOPS = 1_000_000


def _max_hops(text: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited", ""):
        return None
    expected = f"expected a positive integer up to {MAX_HOPS} (or 'unlimited')"
    try:
        return parse_int_between(1, MAX_HOPS)(text)
    except ValueError:
        raise ValueError(expected) from None


def parse_choice(options: Sequence[str]) -> Callable[[str], str]:
    """A parser accepting one of ``options`` (case-insensitive)."""

    def parse(text: str) -> str:
        t = text.strip().lower()
        if t not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return t

    return parse


def parse_seconds(text: str) -> float:
    """Seconds from 0 to :data:`MAX_SECONDS`, with an optional ``s`` suffix."""
    value = _number(text.strip().removesuffix("s"))
    if not 0 <= value <= MAX_SECONDS:
        raise ValueError(f"expected seconds >= 0 and at most {MAX_SECONDS:g} (seven days)")
    return value


#: Largest fade-in exponent: past it a new ring's share stays 0 until the window's end.
MAX_FADE_EXPONENT = 100.0


def _fade_exponent(text: str) -> float:
    value = _number(text)
    if not 0.01 <= value <= MAX_FADE_EXPONENT:
        raise ValueError(f"expected a number from 0.01 to {MAX_FADE_EXPONENT:g}")
    return value


def seconds_at_least(minimum: float, maximum: float | None = None) -> Callable[[str], float]:
    """A parser of a finite number of seconds (``"2"``, ``"2.5s"``) from ``minimum`` on.

    At most ``maximum`` seconds if given, else at most :data:`MAX_SECONDS`.
    """
    if maximum is not None:
        expected = f"expected seconds from {minimum:g} to {maximum:g}"
    else:
        expected = f"expected seconds >= {minimum:g} and at most {MAX_SECONDS:g} (seven days)"

    def parse(text: str) -> float:
        try:
            value = parse_seconds(text)
        except ValueError:
            if maximum is None:
                raise
            raise ValueError(expected) from None
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(expected)
        return value

    return parse


def _vnodes(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("expected a positive integer") from None
    if not 1 <= value <= 10_000:
        raise ValueError("expected an integer from 1 to 10000")
    return value


# --------------------------------------------------------------------------------------
# The routing knobs.

ROUTING_KNOBS: tuple[Knob, ...] = (
    Knob(
        "enabled",
        "CSLB_ENABLED",
        "--enabled",
        True,
        parse_bool,
        "Kill switch. 'false' sends every key to fallback (index -1: the caller uses the "
        "ingress as before) on every worker of the host at the same table generation.",
        "BOOL",
    ),
    Knob(
        "percentage",
        "CSLB_PERCENTAGE",
        "--percentage",
        100.0,
        _percentage,
        "Share of keys (0-100) routed client-side, chosen per key and deterministically; "
        "raising it only adds keys, lowering it only removes them.",
        "PCT",
    ),
    Knob(
        "balance_factor",
        "CSLB_BALANCE_FACTOR",
        "--balance-factor",
        1.25,
        _balance_factor,
        "Bounded load: an endpoint above balance_factor × average load passes the key on "
        "along the ring. Must be >= 1; 'off' disables the bound (plain consistent hashing).",
        "F",
    ),
    Knob(
        "max_hops",
        "CSLB_MAX_HOPS",
        "--max-hops",
        10,
        _max_hops,
        "Distinct endpoints the bounded-load walk visits before it takes the least loaded "
        "one it saw; 'unlimited' is Skipper's full lap.",
        "N",
    ),
    Knob(
        "load_signal",
        "CSLB_LOAD_SIGNAL",
        "--load-signal",
        "occupancy",
        parse_choice(LOAD_SIGNALS),
        "Load that bounded load compares: 'occupancy' = busy-seconds per second over the "
        "window (calls still open count from their start), its bar counting the routed call "
        "as its mean latency / window instead of Skipper's 1 request (so it binds at about "
        "balance_factor × the mean); 'effective' = max(in-flight, occupancy) × min(pod "
        "latency / global latency, 5), whose in-flight term is the open calls at the last "
        "load refresh: with a fan-out's calls all in flight at once it swings with every "
        "batch and moves keys on a healthy fleet; 'in-flight' = open requests (Skipper's "
        "signal).",
        "SIGNAL",
    ),
    Knob(
        "fade_mode",
        "CSLB_FADE_MODE",
        "--fade-mode",
        "n-ring",
        parse_choice(FADE_MODES),
        "How new pods are brought in: 'n-ring' (each scale-up event gets its own ring and "
        "curve, each key moves once), 'skipper' (Skipper's per-request random filter) or "
        "'off' (new pods take their full share at once).",
        "MODE",
    ),
    Knob(
        "fade_duration_s",
        "CSLB_FADE_DURATION",
        "--fade-duration",
        30.0,
        parse_seconds,
        "Fade-in window D in seconds: a new ring carries clamp(t / D, 0, 1) ** E of the "
        "keys. 0 disables fade-in.",
        "SECONDS",
    ),
    Knob(
        "fade_exponent",
        "CSLB_FADE_EXPONENT",
        "--fade-exponent",
        2.5,
        _fade_exponent,
        "Fade-in exponent E: with 2.5 a new ring carries 0.3 % of keys at 10 % of the "
        "window, 17.7 % at 50 % and 76.8 % at 90 %.",
        "E",
    ),
    Knob(
        "vnodes",
        "CSLB_VNODES",
        "--vnodes",
        100,
        _vnodes,
        "Virtual nodes per endpoint. Skipper always uses 100; change it only when no "
        "Skipper shares the pods' caches.",
        "N",
    ),
)

_BY_NAME = {k.name: k for k in ROUTING_KNOBS}

#: Kernel choices: the native one if it loads (else NumPy, with a warning), or either.
KERNELS = ("auto", "native", "numpy")

#: Which kernel lbcore routes on. A process setting, not a routing knob: it is read once,
#: from the environment, when lbcore is imported (:mod:`lbcore.kernel`).
KERNEL = Knob(
    "kernel",
    "CSLB_KERNEL",
    "--kernel",
    "auto",
    parse_choice(KERNELS),
    "Which of lbcore's two kernels routes: 'auto' the compiled C kernel if it was built "
    "and loads, else the NumPy kernel with one warning naming why; 'native' the C kernel "
    "or fail at import; 'numpy' the NumPy reference kernel (same answers, slower). Read "
    "once, when lbcore is imported: the only setting lbcore reads from the environment "
    "(the --kernel flag of cslb serve, route and simulate sets it for the command and the "
    "processes it starts).",
    "KERNEL",
)

#: Renderings of cslb's log lines (:mod:`lbcore.logformat`).
LOG_FORMATS = ("json", "text")
#: Levels of cslb's log lines, in increasing severity.
LOG_LEVELS = ("debug", "info", "warning", "error")

#: How cslb's own processes write their log lines. A process setting every room reads
#: (from the environment, or a flag of its command): declared here because every room
#: may import lbcore.
LOG_FORMAT = Knob(
    "log_format",
    "CSLB_LOG_FORMAT",
    "--log-format",
    "json",
    parse_choice(LOG_FORMATS),
    "How cslb's own processes write log lines to stderr (discovery, and cslb's lines of "
    "the gunicorn master and workers under workers.gunicorn_conf or cslb serve): 'json' "
    "one JSON object per line (timestamp, level, logger, event, pid, then the event's "
    "fields), 'text' the same parts as one readable line. Inside your own app cslb only "
    "logs to its 'cslb.*' loggers and leaves formatting to you.",
    "FORMAT",
)

#: The lowest level of cslb's log lines that is written.
LOG_LEVEL = Knob(
    "log_level",
    "CSLB_LOG_LEVEL",
    "--log-level",
    "info",
    parse_choice(LOG_LEVELS),
    "Lowest level of cslb's log lines written to stderr (discovery, and cslb's lines of "
    "the gunicorn master and workers under workers.gunicorn_conf or cslb serve).",
    "LEVEL",
)

#: The two log settings.
LOG_KNOBS: tuple[Knob, ...] = (LOG_FORMAT, LOG_LEVEL)


def knob(name: str) -> Knob:
    """The routing knob called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KnobError(f"no routing knob named {name!r}") from None


def defaults(knobs: Iterable[Knob] = ROUTING_KNOBS) -> dict[str, Any]:
    """Every knob's default value, by name."""
    return {k.name: k.default for k in knobs}


def from_mapping(
    data: Mapping[str, Any], knobs: Iterable[Knob] = ROUTING_KNOBS, *, source: str = "environment"
) -> dict[str, Any]:
    """Values set in ``data`` (environment or ConfigMap data), by knob name.

    Keys may be the environment variable (``CSLB_PERCENTAGE``) or the knob name
    (``percentage``). Knobs not in ``data`` are left out, so mappings can be layered.

    Raises
    ------
    KnobError
        Naming the source, the variable and what was expected.
    """
    out: dict[str, Any] = {}
    for k in knobs:
        for key in (k.env, k.name):
            if key in data:
                out[k.name] = k.convert(data[key], source)
                break
    return out


def add_arguments(parser: argparse.ArgumentParser, knobs: Iterable[Knob] = ROUTING_KNOBS) -> None:
    """Add one ``--flag`` per knob, with its doc and environment variable in the help."""
    for k in knobs:
        parser.add_argument(
            k.flag,
            dest=k.name,
            default=None,
            metavar=k.metavar,
            help=f"{k.doc} [env {k.env}, default {k.shown_default}]".replace("%", "%%"),
        )


def from_args(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    knobs: Iterable[Knob] = ROUTING_KNOBS,
) -> dict[str, Any]:
    """Resolve every knob: command-line flag, else environment variable, else default."""
    knobs = tuple(knobs)
    values = defaults(knobs)
    values.update(from_mapping(environ, knobs, source="environment"))
    for k in knobs:
        raw = getattr(args, k.name, None)
        if raw is not None:
            values[k.name] = k.convert(raw, f"flag {k.flag}")
    return values


def docs_table(knobs: Iterable[Knob] = ROUTING_KNOBS, *, flags: bool = True) -> str:
    """A Markdown table of the knobs (variable, flag, default, meaning) for the docs.

    A default worked out at run time reads ``auto``, an empty one ``-``
    (:attr:`Knob.shown_default`). ``flags=False`` leaves the flag column out, for
    settings no cslb command takes (the product pods' middleware reads its environment).
    """
    if flags:
        rows = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
    else:
        rows = ["| variable | default | meaning |", "|---|---|---|"]
    for k in knobs:
        shown = k.shown_default
        default = shown if shown == "-" else f"`{shown}`"
        flag = f" `{k.flag}` |" if flags else ""
        rows.append(f"| `{k.env}` |{flag} {default} | {k.doc} |")
    return "\n".join(rows)
