"""The routing processes a benchmark forks, each answering through a one-way pipe.

Every one is joined (or killed) when the benchmark ends.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


class Forked:
    """Fork children of one benchmark run, started in order, stopped by :meth:`close`."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("fork")
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.pipes: list[Connection] = []

    def start(self, target: Callable[..., None], args: Callable[[Connection], tuple]) -> None:
        """Fork ``target(*args(send))``: ``send`` is the child's end of its pipe."""
        recv, send = self.ctx.Pipe(duplex=False)
        p = self.ctx.Process(target=target, args=args(send), daemon=True)
        p.start()
        self.procs.append(p)
        self.pipes.append(recv)

    def receive(self, timeout_s: float, what: str) -> list[Any]:
        """The next thing each child sends, in start order.

        Raises
        ------
        RuntimeError
            When a child sends nothing within ``timeout_s`` seconds (it did not ``what``).
        """
        out = []
        for recv in self.pipes:
            if not recv.poll(timeout_s):
                raise RuntimeError(f"a routing process did not {what} within {timeout_s:g} s")
            out.append(recv.recv())
        return out

    def expect(self, word: str, timeout_s: float, what: str) -> None:
        """Every child sends ``word`` next, within ``timeout_s`` seconds each."""
        if any(got != word for got in self.receive(timeout_s, what)):
            raise RuntimeError(f"a routing process did not {what}")

    def close(self) -> None:
        """Join every child (10 s each); kill the ones still running."""
        for p in self.procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()
                p.join(10)
