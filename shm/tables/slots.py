"""Stable counter slots of endpoints, assigned by the tables writer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lbcore.signals import DEFAULT_WINDOW_NS

#: A freed counter slot is reused only this long after its endpoint left: the occupancy
#: window plus margin, so the new endpoint never inherits the old one's load.
DEFAULT_SLOT_REUSE_NS = DEFAULT_WINDOW_NS + 2_000_000_000


class SlotAllocator:
    """Stable counter columns ("slots") for endpoints, across table generations.

    An endpoint keeps its slot for as long as it is in the table. When it leaves, its
    slot is freed and handed to a new endpoint only ``reuse_after_ns`` later, after its
    counters have aged out of the occupancy window. An address that comes back before
    its old slot was reused gets that slot back (a flapping pod keeps its history).

    Parameters
    ----------
    reuse_after_ns
        Minimum time between freeing a slot and reusing it, in nanoseconds.
    """

    def __init__(self, reuse_after_ns: int = DEFAULT_SLOT_REUSE_NS) -> None:
        self.reuse_after_ns = int(reuse_after_ns)
        self.slot_of: dict[str, int] = {}
        self.freed_ns: dict[int, int] = {}
        self.freed_by: dict[str, int] = {}  # address -> its freed, not yet reused slot
        self.n_slots = 0
        #: Slots the last :meth:`assign` handed to a *different* endpoint than before.
        self.reused: list[int] = []

    def copy(self) -> SlotAllocator:
        """An independent copy (publish works on a copy and commits it on success)."""
        out = SlotAllocator(self.reuse_after_ns)
        out.slot_of = dict(self.slot_of)
        out.freed_ns = dict(self.freed_ns)
        out.freed_by = dict(self.freed_by)
        out.n_slots = self.n_slots
        return out

    @classmethod
    def recover(
        cls, endpoints: Sequence[str], slots: np.ndarray, freed_ns: np.ndarray, reuse_after_ns: int
    ) -> SlotAllocator:
        """Rebuild the allocator from a published table (a new writer taking over)."""
        out = cls(reuse_after_ns)
        out.slot_of = {ep: int(s) for ep, s in zip(endpoints, slots.tolist(), strict=True)}
        out.n_slots = int(freed_ns.size)
        used = set(out.slot_of.values())
        for s, t in enumerate(freed_ns.tolist()):
            if s not in used:
                out.freed_ns[s] = max(int(t), 0)
        return out

    def assign(self, endpoints: Sequence[str], now_ns: int) -> np.ndarray:
        """Slots of ``endpoints`` (unique, as a ring set's) at ``now_ns`` (mutates this allocator).

        Returns
        -------
        numpy.ndarray
            ``int32`` slot per endpoint, unique.
        """
        slot_of = self.slot_of
        got: list[int | None] = list(map(slot_of.get, endpoints))
        new = got.count(None)
        if len(got) - new < len(slot_of):  # (endpoints are unique) some left: free theirs
            wanted = set(endpoints)
            for ep in [ep for ep in slot_of if ep not in wanted]:
                s = slot_of.pop(ep)
                self.freed_ns[s] = now_ns
                self.freed_by[ep] = s
        self.reused = []
        if new:  # new endpoints (a lookup per endpoint above covers the rest)
            reusable = sorted(
                s for s, t in self.freed_ns.items() if now_ns - t >= self.reuse_after_ns
            )
            reusable.reverse()  # pop() takes the lowest
            # A scale-up appends its endpoints: start at the first one without a slot.
            for i in range(got.index(None), len(got)):
                s = got[i]
                if s is not None:
                    continue
                ep = endpoints[i]
                s = self.freed_by.pop(ep, None)
                if s is None or s not in self.freed_ns:
                    s = None
                    while reusable:
                        cand = reusable.pop()
                        if cand in self.freed_ns:
                            s = cand
                            self.reused.append(s)
                            break
                    if s is None:
                        s = self.n_slots
                        self.n_slots += 1
                self.freed_ns.pop(s, None)
                slot_of[ep] = s
                got[i] = s
            # Forget "came back" hints for slots that now belong to someone else.
            taken = set(slot_of.values())
            self.freed_by = {ep: s for ep, s in self.freed_by.items() if s not in taken}
        return np.array(got, dtype=np.int32)

    def freed_array(self) -> np.ndarray:
        """Per slot: ``-1`` in use, else the CLOCK_MONOTONIC time it was freed (ns)."""
        out = np.full(self.n_slots, -1, dtype=np.int64)
        for s, t in self.freed_ns.items():
            out[s] = t
        return out
