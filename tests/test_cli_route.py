import json
import subprocess
import sys

import lbcore
from tests.cslb_runs import ROOT, run_cslb

EXAMPLE = ROOT / "examples" / "endpoints.json"


cslb = run_cslb


def test_route_prints_lbcores_answer():
    eps = [e["address"] for e in json.loads(EXAMPLE.read_text())["endpoints"]]
    keys = ["AD112G0AB-K11", "12345", "ürün-42", ""]
    p = cslb("route", "--endpoints-file", str(EXAMPLE), "--json", *keys)
    assert p.returncode == 0, p.stderr
    routes = json.loads(p.stdout)["routes"]
    want = lbcore.Ring(eps).lookup(keys).tolist()
    assert [r["endpoint"] for r in routes] == [eps[i] for i in want]
    assert routes[0]["zone"].startswith("eu-central-1")


def test_route_reads_stdin_and_explicit_endpoints():
    p = cslb(
        "route",
        "-e",
        "http://10.0.0.1:80",
        "-e",
        "http://10.0.0.2:80",
        "--stdin",
        "-",
        stdin="a\nb\n",
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("- ") and lines[1].startswith("a ")
    assert all("http://10.0.0." in line for line in lines)


def test_route_attempt_one_names_a_different_pod():
    a = cslb("route", "-f", str(EXAMPLE), "--json", "K1")
    b = cslb("route", "-f", str(EXAMPLE), "--json", "--attempt", "1", "K1")
    assert (
        json.loads(a.stdout)["routes"][0]["endpoint"]
        != json.loads(b.stdout)["routes"][0]["endpoint"]
    )


def test_route_errors_are_clear(tmp_path):
    p = cslb("route", "K1")
    assert p.returncode == 2 and "no endpoints" in p.stderr
    bad = tmp_path / "eps.json"
    bad.write_text("{not json")
    p = cslb("route", "-f", str(bad), "K1")
    assert p.returncode == 2 and "not valid JSON" in p.stderr
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps(["http://a:80", "http://a:80"]))
    p = cslb("route", "-f", str(dup), "K1")
    assert p.returncode == 2 and "listed twice" in p.stderr
    p = cslb("nope")
    assert p.returncode == 2 and "unknown command" in p.stderr


def test_yaml_endpoints_file(tmp_path):
    f = tmp_path / "eps.yaml"
    f.write_text(
        "endpoints:\n  - address: http://10.0.0.1:80\n    zone: z1\n  - http://10.0.0.2:80\n"
    )
    p = cslb("route", "-f", str(f), "--json", "x")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["routes"][0]["endpoint"].startswith("http://10.0.0.")


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """``cslb route --stdin | head -1``: the pipe closes under the writer; no traceback."""
    keys = "".join(f"SKU-{i:08d}\n" for i in range(200_000)).encode()
    argv = [sys.executable, "-m", "cslb", "route", "-e", "http://10.0.0.1:80", "--stdin"]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        proc.stdin.write(keys)  # the whole input fits: routing starts after EOF
        proc.stdin.close()
        first = proc.stdout.readline()
        proc.stdout.close()  # like head -1: about 5 MB of answers are still to come
        err = proc.stderr.read().decode()
        status = proc.wait(timeout=60)
    assert first.startswith(b"SKU-00000000  http://10.0.0.1:80")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert status == 1


def test_version_prints_the_installed_distributions_version():
    import importlib.metadata

    for flag in ("--version", "-V"):
        p = cslb(flag)
        assert p.returncode == 0, p.stderr
        assert p.stdout == f"cslb {importlib.metadata.version('cslb')}\n"
    assert "--version" in cslb("--help").stdout


def test_subcommand_argument_parsing_lives_in_the_cslb_package():
    """The rooms expose functions; only cslb/ parses argv, one module per subcommand.

    The one exception is the benchmark suite's own command, ``python -m perf``
    (perf/command.py), which ``cslb bench`` is: perf never imports cslb.
    """
    import re

    paths = [
        p for room in ("discovery", "workers", "lbcore", "shm") for p in (ROOT / room).rglob("*.py")
    ]
    # perf: what cslb bench and cslb simulate run (perf/bench_*.py are standalone
    # developer scripts, python -m perf.bench_x, not cslb subcommands).
    paths += [ROOT / "perf" / "suite.py", ROOT / "perf" / "__main__.py"]
    paths += list((ROOT / "perf" / "sim").rglob("*.py"))
    for path in paths:
        assert not re.search(r"ArgumentParser\(", path.read_text()), path
    from cslb.cli import COMMANDS

    assert {"bench", "simulate"} <= set(COMMANDS)
    for name, (module, _) in COMMANDS.items():
        assert module == f"cslb.{name}_cmd", name


def test_perf_never_imports_the_command_line():
    """Arrows point one way: cslb may use perf (``cslb bench``, ``cslb simulate``), perf
    never cslb; and no package room imports perf or cslb."""
    import ast

    def imported(path):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                yield from (a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield node.module.split(".")[0]

    for path in (ROOT / "perf").rglob("*.py"):
        assert "cslb" not in set(imported(path)), path
    for room in ("lbcore", "shm", "discovery", "workers"):
        for path in (ROOT / room).rglob("*.py"):
            assert not {"perf", "cslb"} & set(imported(path)), path
