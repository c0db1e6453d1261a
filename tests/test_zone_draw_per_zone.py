"""Z2's draw is salted per caller zone: each zone keeps its own local keys.

Within a zone the local sets are nested in the share; across zones they are independent
draws, so the keys one zone keeps remote are mostly local in the others (where, by Z1,
their local pod in their global owner's zone is that owner). The salt is a function of
the zone's name only: every process on every machine draws the same keys for a zone.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import xxhash

import lbcore
from lbcore import Plan, RingSet, ZoneSplit
from lbcore.zones import ZONE_SALT, local_mask, zone_salt

NAMES = ("z-a", "z-b", "z-c", "eu-central-1a", "")
HASHES = np.random.default_rng(2107).integers(0, 2**64, size=200_000, dtype=np.uint64)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fmix64(h: int) -> int:
    """MurmurHash3's fmix64, written from its definition."""
    m = (1 << 64) - 1
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & m
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & m
    return h ^ (h >> 33)


def test_zone_salt_is_pinned():
    """Golden values: a pin, not a preference.

    Changing the salt's rule (or ZONE_SALT) moves every zone's local keys on upgrade:
    hosts of one zone running two versions would keep different keys local and split
    the zone's cache. Change these values only with that cost in mind.
    """
    assert zone_salt("z-a") == 0x051A418CCC17B06F
    assert zone_salt("eu-central-1a") == 0xEC8BDEFE1743C0EE
    for name in NAMES:
        # the rule: the name hashed as a key is (XXH64, seed 0, UTF-8), mixed with ZONE_SALT
        assert zone_salt(name) == _fmix64(xxhash.xxh64_intdigest(name.encode()) ^ ZONE_SALT)
        assert ZoneSplit(np.zeros(3, np.bool_), 0.5, name=name).salt == zone_salt(name)
    assert len({zone_salt(n) for n in NAMES}) == len(NAMES)
    with pytest.raises(lbcore.ArgumentError, match="zone name"):
        zone_salt(b"z-a")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_each_zones_local_set_is_nested_in_the_share(name):
    shares = np.linspace(0.0, 1.0, 11)
    masks = [local_mask(HASHES, x, name) for x in shares]
    for a, b in itertools.pairwise(masks):
        assert not (a & ~b).any()
    for x, m in zip(shares, masks, strict=True):
        assert abs(m.mean() - x) < 5 * np.sqrt(x * (1 - x) / HASHES.size) + 1e-12


@pytest.mark.parametrize("x", [0.25, 0.5, 0.9, 0.99])
def test_two_zones_local_sets_overlap_as_independent_draws(x):
    """Both local: about x²; both remote (the keys no zone keeps): about (1 - x)²."""
    n = HASHES.size
    for a, b in itertools.combinations(NAMES[:4], 2):
        la, lb = local_mask(HASHES, x, a), local_mask(HASHES, x, b)
        for got, p in (((la & lb).sum(), x * x), ((~la & ~lb).sum(), (1 - x) ** 2)):
            sd = np.sqrt(n * p * (1 - p))
            assert abs(got - n * p) < 5 * sd, (a, b, x, got, n * p)


def test_a_zones_remote_keys_are_local_in_the_other_zones():
    """At 0.99 a zone keeps 1 % of keys remote; the others keep ~99 % of those local."""
    remote = ~local_mask(HASHES, 0.99, "z-a")
    for other in ("z-b", "z-c"):
        assert local_mask(HASHES, 0.99, other)[remote].mean() > 0.97


def test_the_same_zone_draws_the_same_keys_in_another_process():
    keys = [f"sku-{i}" for i in range(5000)]
    here = {z: lbcore.local_keys(keys, 0.3, z) for z in ("z-a", "eu-central-1a")}
    code = (
        "import sys, lbcore\n"
        "keys = [f'sku-{i}' for i in range(5000)]\n"
        "for z in ('z-a', 'eu-central-1a'):\n"
        "    bits = lbcore.local_keys(keys, 0.3, z)\n"
        "    sys.stdout.write(''.join('1' if b else '0' for b in bits) + '\\n')\n"
    )
    for kernel in ("native", "numpy"):
        env = {**os.environ, "CSLB_KERNEL": kernel, "PYTHONHASHSEED": "12345"}
        if kernel == "native" and lbcore.kernel.native_unavailable() is not None:
            continue
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, timeout=120
        )
        assert out.returncode == 0, out.stderr.decode()
        lines = out.stdout.decode().split()
        for z, line in zip(("z-a", "eu-central-1a"), lines, strict=True):
            assert [c == "1" for c in line] == here[z].tolist(), (kernel, z)
    assert (here["z-a"] != here["eu-central-1a"]).any()


def _pod(i: int) -> str:
    return f"http://10.2.{i % 3}.{i}:8080"


FLEET = RingSet([_pod(i) for i in range(12)])
FLEET_ZONES = [("z-a", "z-b", "z-c")[i % 3] for i in range(12)]


@pytest.mark.parametrize("name", ["z-a", "z-b"])
@pytest.mark.parametrize("x", [0.3, 0.99])
def test_both_kernels_route_a_key_on_the_zone_ring_exactly_when_it_is_local(kernel, name, x):
    h = HASHES[:40_000]

    def routed(share: float | None) -> np.ndarray:
        zone = None if share is None else ZoneSplit.for_zone(FLEET_ZONES, name, share)
        return Plan(FLEET, 0, zone=zone).route_hashes(h)[0]

    got, on_zone, on_global = routed(x), routed(1.0), routed(None)
    local = local_mask(h, x, name)
    differ = on_zone != on_global  # keys whose global owner is remote
    assert differ.mean() > 0.5
    assert ((got == on_zone)[differ] == local[differ]).all()
    assert (got[~differ] == on_zone[~differ]).all()
