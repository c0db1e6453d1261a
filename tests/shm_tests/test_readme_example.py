"""docs/shared-memory.md's example (once the README's) runs as written (in a test namespace)."""

import pathlib
import re

import numpy as np

import lbcore
from lbcore.route import route_ring_set
from shm import list_segments

README = pathlib.Path(__file__).resolve().parents[2] / "docs" / "shared-memory.md"


def example_code() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Using the shared memory directly") :]
    end = section.find("\n## ", 3)
    section = section[: end if end >= 0 else len(section)]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_routes_records_and_cleans_up(namespace):
    code = example_code()
    assert '"prapi"' in code
    scope: dict = {}
    exec(code.replace('"prapi"', repr(namespace)), scope)  # our own README
    keys, idx, slots, targets = (scope[k] for k in ("keys", "idx", "slots", "targets"))
    eps = ("http://10.2.0.1:8080", "http://10.2.0.2:8080")
    hashes = lbcore.hash_keys(keys)
    want = lbcore.Gate(True, 50).apply(route_ring_set(lbcore.RingSet(eps), keys, 0), hashes)
    assert np.array_equal(idx, want)
    assert 0 < (idx >= 0).sum() < len(keys)  # the gate sent some keys to the ingress
    assert targets == [eps[i] for i in idx[idx >= 0]]
    assert slots.tolist() == [eps.index(a) for a in targets]  # slots follow publish order
    assert list_segments(namespace) == []  # the example closes what it created
