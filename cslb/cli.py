"""``cslb`` command dispatcher.

Every subcommand's argument parsing lives in this package (``cslb.<name>_cmd``, each a
thin wrapper over its room's function: :func:`discovery.cli.run`,
:func:`workers.surfaces.inspect_report.run`, :func:`workers.master.serve.plan`,
:func:`perf.suite.run`, :func:`perf.sim.options.run_scenario`...). Subcommands are
imported only when used, so ``cslb route`` never loads the Kubernetes client and ``cslb
discovery`` never loads gunicorn.
"""

from __future__ import annotations

import importlib
import os
import sys

# name -> (module with main(argv) -> int, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "route": (
        "cslb.route_cmd",
        "print which pod each key goes to: on Skipper's ring, or --live on this host, with why",
    ),
    "discovery": (
        "cslb.discovery_cmd",
        "run the host's discovery process (EndpointSlices/static -> shared-memory tables)",
    ),
    "serve": (
        "cslb.serve_cmd",
        "run the routing service under gunicorn with discovery embedded (no cluster needed)",
    ),
    "inspect": (
        "cslb.inspect_cmd",
        "print the host's current routing table: generation, endpoints, fades, knobs",
    ),
    "bench": (
        "cslb.bench_cmd",
        "run the benchmark suite (in-process, host, HTTP, control plane) -> perf/RESULTS.md",
    ),
    "simulate": (
        "cslb.simulate_cmd",
        "simulate scale-ups, load signals and slow pods with lbcore's routing",
    ),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: cslb [--version] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run 'cslb COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``cslb``; returns the process exit status."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("--version", "-V"):
        from cslb import __version__

        print(f"cslb {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"cslb: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        status = int(module.main(rest) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``cslb simulate --json | head``): no traceback. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
