"""The native kernel reads each element of a shared-memory ring array once.

The ring's arrays (hashes, owners, buckets, the guard word) are usually views of a
segment any process of the user can write. A plain read there lets the compiler load
the element again after it was checked (a checked owner could index with another
value), so every such read goes through ``LOAD_RELAXED`` (one load, never repeated) or
is a prefetch: in the C sources each subscript of these arrays has its address taken.
"""

from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "lbcore" / "csrc"
SHARED = ("hashes", "owners", "buckets", "guard_words")
SUBSCRIPT = re.compile(r"(&?)\s*(?:\b\w+\s*->\s*)?\b(" + "|".join(SHARED) + r")\s*\[")


def test_shared_arrays_are_read_through_one_load():
    sources = sorted(CSRC.glob("*.[ch]"))
    assert sources
    plain = []
    seen = 0
    for path in sources:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            for m in SUBSCRIPT.finditer(line):
                seen += 1
                if not m.group(1):
                    plain.append(f"{path.name}:{no}: {line.strip()}")
    assert seen, "no subscript of a shared array found: the pattern is stale"
    assert not plain, "plain reads of shared memory:\n" + "\n".join(plain)
