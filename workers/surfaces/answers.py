"""The ``POST /route`` answer text on one table: :class:`RouteAnswers`.

The answer forms are described in :mod:`workers.surfaces.body`. Everything that depends
only on the table (each endpoint's JSON string, the answer's head) is built once per
table generation, so a request costs one gather over the routed indices and no Python
step per key.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["RouteAnswers"]

#: Most padding the fixed-width answer pieces may add, as a share of the bytes the
#: endpoints' JSON strings need without it; beyond that the answer is joined per key.
MAX_PADDING = 0.25


class RouteAnswers:
    """The pieces of the ``/route`` answers on one table, built once per generation.

    Parameters
    ----------
    table
        The table the answers name endpoints of (``None``: no table yet, generation 0,
        every key ``null``).

    Attributes
    ----------
    table
        The table given (compare by identity to know whether these answers are current).
    generation : int
        Its generation (0 without a table).
    enc : list[str]
        The JSON text of each endpoint and ``"null"`` last, so that index -1 (the
        fallback) takes it.
    pieces : numpy.ndarray or None
        The same as one fixed-width ``bytes`` array, each entry ``,"endpoint"`` padded
        with spaces (JSON whitespace) to the longest, so that an answer of ``n`` keys is
        one ``take`` and one ``tobytes``; ``None`` when the endpoints' lengths differ so
        much that the padding would add over :data:`MAX_PADDING` to the answer's size
        (then the strings are joined per key).
    """

    __slots__ = ("enc", "generation", "head", "pieces", "table")

    def __init__(self, table: Any) -> None:
        self.table = table
        self.generation = int(table.generation) if table is not None else 0
        endpoints = () if table is None else table.endpoints
        # json.dumps escapes every non-ASCII character: the text is ASCII.
        self.enc = [*map(json.dumps, endpoints), "null"]
        self.head = b'{"generation": %d, "endpoints": [' % self.generation
        raw = [b"," + e.encode("ascii") for e in self.enc]
        width = max(map(len, raw))
        need = sum(map(len, raw[:-1])) or 1
        self.pieces: np.ndarray | None = None
        if len(raw) == 1 or width * (len(raw) - 1) <= need * (1.0 + MAX_PADDING):
            self.pieces = np.array([r.ljust(width) for r in raw], dtype=f"S{width}")

    def plain(self, idx: np.ndarray) -> bytes:
        """``{"generation": G, "endpoints": [...]}`` for the endpoint indices ``idx``.

        Parameters
        ----------
        idx
            Index into the table's endpoints per key, ``-1`` for a fallback key.
        """
        if not idx.size:
            return self.head + b"]}"
        pieces = self.pieces
        if pieces is not None:
            body = pieces.take(idx).tobytes()
            # Drop the comma of the first entry, in the same copy as the head and tail.
            return b"".join((self.head, memoryview(body)[1:], b"]}"))
        enc = self.enc
        return b"%b%b]}" % (self.head, ", ".join([enc[i] for i in idx.tolist()]).encode())

    def grouped(self, idx: np.ndarray) -> bytes:
        """The group form: positions per endpoint (table order), fallback positions apart.

        Parameters
        ----------
        idx
            Index into the table's endpoints per key, ``-1`` for a fallback key.
        """
        generation, enc = self.generation, self.enc
        if not idx.size:
            return b'{"generation": %d, "groups": {}, "fallback": []}' % generation
        order = np.argsort(idx, kind="stable")
        ranked = idx[order]
        cuts = [0, *(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), idx.size]
        pos = list(map(str, order.tolist()))
        heads = ranked[cuts[:-1]].tolist()
        groups = [
            f"{enc[e]}: [{', '.join(pos[lo:hi])}]"
            for e, lo, hi in zip(heads, cuts, cuts[1:], strict=False)
            if e >= 0
        ]
        fallback = ", ".join(pos[: cuts[1]]) if heads[0] < 0 else ""  # -1 sorts first
        return (
            f'{{"generation": {generation}, "groups": {{{", ".join(groups)}}}, '
            f'"fallback": [{fallback}]}}'
        ).encode()
