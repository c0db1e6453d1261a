"""Discovery under hostile sources: a failed publish is forgotten once the sources are
back at what is published (no 'publish failed' forever), labels are validated like
addresses in every source, and lost tables segments are published again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import shm
from discovery.endpoints import parse_slice
from tests.discovery_harness import Loop, shm_namespace, wait_until
from tests.kubeapi import endpoint, endpoint_slice

A = ["http://10.3.0.1:80", "http://10.3.0.2:80"]
X = "http://10.3.0.9:80"


def _write(path: Path, addresses: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(addresses))
    os.replace(tmp, path)


def _problem(ns: str) -> str:
    reader = shm.TableReader(ns)
    try:
        status = reader.status()
        return "" if status is None else status.problem
    finally:
        reader.close()


def test_a_failed_publish_is_cleared_when_the_sources_return_to_the_published_set(
    tmp_path: Path,
) -> None:
    eps = tmp_path / "eps.json"
    _write(eps, A)
    with shm_namespace() as ns:
        loop = Loop(ns, service=None, endpoints_file=str(eps), debounce_s=0.05)
        real = loop.publisher.publish

        def publish(t, *args, **kw):
            if X in t.ring_set.endpoints:
                raise shm.SegmentFullError("/cslb.x", "no room (injected)")
            return real(t, *args, **kw)

        loop.publisher.publish = publish  # type: ignore[method-assign]
        loop.start()
        try:
            loop.wait_generation(1)
            _write(eps, [*A, X])
            wait_until(lambda: "publish failed" in _problem(ns), what="the failure reported")
            _write(eps, A)
            wait_until(lambda: _problem(ns) == "", what="the problem cleared")
            assert loop.generation() == 1  # nothing new was published: nothing changed
            assert loop.named("publish_skipped")
        finally:
            loop.stop()


def test_slice_labels_with_control_characters_or_surrogates_are_skipped() -> None:
    good = endpoint("10.1.0.1", node="node-a")
    bad_zone = endpoint("10.1.0.2", node="node-b")
    bad_zone["zone"] = "eu\x00west"
    bad_node = endpoint("10.1.0.3", node="\ud800")
    parsed = parse_slice(
        endpoint_slice("catalog-a", "catalog", [good, bad_zone, bad_node])
    )
    assert [e.address for e in parsed.endpoints] == ["http://10.1.0.1:8080"]
    assert len(parsed.problems) == 2
    assert "'zone' has a control" in parsed.problems[0]
    assert "'nodeName' has a lone surrogate" in parsed.problems[1]
