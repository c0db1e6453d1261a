"""Tables whose content is a known function of the generation number.

The writer of the multi-process tests publishes, for generation ``g``, variant
``g % VARIANTS`` (a ring set with its own endpoint count and number of fading rings)
with ejection state, zones and knobs derived from ``g``. A reader can therefore check any table
it routed on against what the writer must have written for that generation: a torn or
mixed read (hashes of one generation, owners or metadata of another) fails the check.
"""

from __future__ import annotations

import numpy as np

import lbcore
from lbcore.ejection import Ejections
from lbcore.route import route_ring_set
from shm import Knobs, Table, TableWriter

VNODES = 5
START_NS = 1_000_000_000_000
NOW_NS = START_NS + 20_000_000_000  # 2/3 through the fade of the fading rings
SIZES = (2, 5, 9, 17, 33, 60, 4, 25)
VARIANTS = len(SIZES)
KEYS = [f"SKU-{i:05d}" for i in range(64)]


def variant(v: int) -> lbcore.RingSet:
    """Ring set of variant ``v``: 0, 1 or 2 fading rings, ``SIZES[v]`` endpoints."""
    n = SIZES[v]
    eps = [f"http://10.{v}.{i // 200}.{i % 200 + 1}:8080" for i in range(n)]
    fading = v % 3 if n >= 3 else 0
    cut = [n - (n * j) // 4 for j in range(fading, 0, -1)] if fading else []
    rs = lbcore.RingSet(eps[: cut[0]] if cut else eps, vnodes=VNODES)
    for j, c in enumerate(cut):
        stop = cut[j + 1] if j + 1 < len(cut) else n
        rs = rs.scale_up(eps[c:stop], now_ns=START_NS + j * 1_000_000_000)
    return rs


def expected_routes() -> list[np.ndarray]:
    """Route of :data:`KEYS` at :data:`NOW_NS` for every variant, computed from scratch."""
    return [route_ring_set(variant(v), KEYS, NOW_NS) for v in range(VARIANTS)]


def ejections_of(g: int, n: int) -> Ejections:
    """Ejection state that names generation ``g`` (until-times and counts)."""
    e = Ejections.none(n)
    return Ejections.of(e.reason, g + np.arange(n), e.multiplier, e.decay_ns, e.counts + g)


def publish_generation(writer: TableWriter, ring_sets: list[lbcore.RingSet]) -> int:
    """Publish the next generation's content; returns its number."""
    g = writer.generation + 1
    rs = ring_sets[g % VARIANTS]
    n = len(rs.endpoints)
    got = writer.publish(
        rs,
        ejections=ejections_of(g, n),
        zones=[f"zone-{g % 3}"] * n,
        knobs=Knobs(percentage=float(g % 101), max_hops=1 + g % 7),
    )
    assert got == g
    return g


def check(table: Table, routes: list[np.ndarray], ring_sets: list[lbcore.RingSet]) -> str | None:
    """None if ``table`` is exactly generation ``table.generation``'s content, else why not.

    Reads the table's shared memory; call :meth:`Table.valid` afterwards and ignore the
    verdict if it turned invalid meanwhile.
    """
    g = table.generation
    v = g % VARIANTS
    rs = ring_sets[v]
    if table.endpoints != rs.endpoints:
        return f"gen {g}: endpoints of another variant ({len(table.endpoints)})"
    if len(table.ring_set.rings) != len(rs.rings):
        return f"gen {g}: {len(table.ring_set.rings)} rings, expected {len(rs.rings)}"
    got = route_ring_set(table.ring_set, KEYS, NOW_NS)
    if not np.array_equal(got, routes[v]):
        return f"gen {g}: routes differ from the variant's"
    want = ejections_of(g, len(rs.endpoints))
    got_e = table.ejections
    if not (
        np.array_equal(got_e.until_ns, want.until_ns) and np.array_equal(got_e.counts, want.counts)
    ):
        return f"gen {g}: ejection state of another generation"
    if table.knobs.percentage != float(g % 101) or table.knobs.max_hops != 1 + g % 7:
        return f"gen {g}: knobs of another generation ({table.knobs})"
    if table.zones and table.zones[0] != f"zone-{g % 3}":
        return f"gen {g}: zones of another generation"
    for mine, theirs in zip(table.ring_set.rings, rs.rings, strict=True):
        if not (
            np.array_equal(mine.hashes, theirs.hashes)
            and np.array_equal(mine.owners, theirs.owners)
            and np.array_equal(mine.buckets, theirs.buckets)
        ):
            return f"gen {g}: ring arrays differ"
    return None
