"""Where the callers are: the endpoints file's ``callers`` object (validated like the
file's other fields) and the caller's own Service's slices (its zone by its IP, ready
callers per zone)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from discovery.callers import callers_from_slices
from discovery.endpoints import parse_member_slice
from discovery.static import EndpointsFileError, EndpointsFileWatcher, load_endpoints_document
from tests.kubeapi import endpoint, endpoint_slice

A, B = "http://10.2.0.1:8080", "http://10.2.0.2:8080"
DOC = (Path(__file__).resolve().parent.parent / "docs" / "endpoints-file.md").read_text()


def _write(tmp_path: Path, doc: object, name: str = "pods.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_callers_are_read_with_the_endpoints(tmp_path):
    p = _write(tmp_path, {"endpoints": [A, B], "callers": {"z-a": 4, "z-b": 0}})
    specs, callers = load_endpoints_document(p)
    assert [s.address for s in specs] == [A, B]
    assert callers == {"z-a": 4, "z-b": 0}
    assert load_endpoints_document(_write(tmp_path, {"endpoints": [A]}))[1] is None
    assert load_endpoints_document(_write(tmp_path, [A]))[1] is None
    y = tmp_path / "pods.yaml"
    y.write_text("endpoints: [http://10.2.0.1:8080]\ncallers: {z-a: 2}\n")
    assert load_endpoints_document(y)[1] == {"z-a": 2}


@pytest.mark.parametrize(
    ("callers", "error"),
    [
        ([1, 2], "'callers' must be an object of zone to number of callers"),
        (
            {"z-a": -1},
            "callers['z-a']: must be a whole number of callers from 0 to 1000000, got -1",
        ),
        ({"z-a": 2.5}, "callers['z-a']: must be a whole number of callers"),
        ({"z-a": True}, "callers['z-a']: must be a whole number of callers"),
        ({"z-a": "4"}, "callers['z-a']: must be a whole number of callers"),
        ({"z-a": 10**7}, "from 0 to 1000000, got 10000000"),
        ({"": 1}, "callers['']: a zone name must be a non-empty string"),
        ({"z\x1b": 1}, "the zone name has a control or format character"),
    ],
)
def test_bad_callers_make_the_file_invalid_with_a_clear_error(tmp_path, callers, error):
    p = _write(tmp_path, {"endpoints": [A], "callers": callers})
    with pytest.raises(EndpointsFileError, match=re.escape(error)) as exc:
        load_endpoints_document(p)
    assert str(exc.value).startswith(f"{p}: ")


def test_the_docs_error_example_is_what_the_parser_says(tmp_path):
    (shown,) = re.findall(r"`(pods\.json: callers\[[^`]*)`", DOC)
    p = _write(tmp_path, {"endpoints": [A], "callers": {"z-a": -1}})
    with pytest.raises(EndpointsFileError) as exc:
        load_endpoints_document(p)
    assert str(exc.value) == f"{tmp_path}/{shown}"


def test_the_watcher_keeps_the_last_good_callers(tmp_path):
    p = _write(tmp_path, {"endpoints": [A], "callers": {"z-a": 1}})
    w = EndpointsFileWatcher(p)
    assert w.poll() is not None and w.callers == {"z-a": 1}
    _write(tmp_path, {"endpoints": [A], "callers": {"z-a": 3, "z-b": 1}})
    assert w.poll() is None  # the endpoints did not change ...
    assert w.callers == {"z-a": 3, "z-b": 1}  # ... the callers did
    _write(tmp_path, {"endpoints": [A], "callers": {"z-a": -3}})
    with pytest.raises(EndpointsFileError):
        w.poll()
    assert w.callers == {"z-a": 3, "z-b": 1}


def _slices(*eps_by_slice):
    return [
        parse_member_slice(endpoint_slice(f"app-{i}", "app", eps, ports=[("a", 1), ("b", 2)]))
        for i, eps in enumerate(eps_by_slice)
    ]


def test_the_callers_zone_is_its_own_pods_and_counts_are_ready_pods_per_zone():
    slices = _slices(
        [endpoint("10.0.0.1", zone="z-a"), endpoint("10.0.0.2", zone="z-b")],
        [
            endpoint("10.0.0.3", zone="z-b"),
            endpoint("10.0.0.4", zone="z-c", ready=False),
            endpoint("10.0.0.2", zone="z-b"),  # in two slices: counted once
            endpoint("10.0.0.5", zone="z-c", terminating=True, ready=False),
        ],
    )
    v = callers_from_slices(slices, "10.0.0.3")
    assert (v.zone, v.found) == ("z-b", True)
    assert v.counts == {"z-a": 1, "z-b": 2}
    # not ready yet (discovery starts before the workers serve): found, and counted
    v = callers_from_slices(slices, "10.0.0.4")
    assert (v.zone, v.found, v.counts) == ("z-c", True, {"z-a": 1, "z-b": 2, "z-c": 1})
    v = callers_from_slices(slices, "10.9.9.9")
    assert (v.zone, v.found, v.counts) == ("", False, {"z-a": 1, "z-b": 2})


def test_member_slices_need_no_port_and_keep_the_readiness_rules():
    (s,) = _slices([endpoint("10.0.0.1", zone="z-a", ready=False)])
    assert [(e.address, e.ready) for e in s.endpoints] == [("10.0.0.1", False)]
    (s,) = [parse_member_slice(endpoint_slice("x", "app", [endpoint("10.0.0.1")], ports=None))]
    assert [e.host for e in s.endpoints] == ["10.0.0.1"]
