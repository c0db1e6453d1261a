"""Fixtures for the shm tests: unique namespaces whose segments are always removed, and
child processes that are always killed, even when a test fails."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from tests.shm_names import Namespaces
from tests.shm_tests.window import window_store

_NAMES = Namespaces("t")


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses; every segment under it is unlinked afterwards."""
    with _NAMES.one() as ns:
        yield ns


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_segments():
    yield
    _NAMES.sweep()  # a crashed test's leftovers: remove them too


class Processes:
    """Starts fork children and remembers them, so teardown can SIGKILL the leftovers."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("fork")
        self.started: list[multiprocessing.process.BaseProcess] = []

    def start(self, target, *args, **kwargs) -> multiprocessing.process.BaseProcess:
        p = self.ctx.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        p.start()
        self.started.append(p)
        return p

    def stop_all(self) -> None:
        for p in self.started:
            if p.pid is not None and p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.join(timeout=10)


@pytest.fixture
def procs():
    """Fork children for a test; any still running at teardown are SIGKILLed by PID."""
    ps = Processes()
    yield ps
    ps.stop_all()


@pytest.fixture
def store_rows() -> int:
    """How many rows the ``store`` fixture's counter matrix has (a module may override it)."""
    return 4


@pytest.fixture
def store(namespace, store_rows):
    """A new counter matrix with the counter tests' window (``tests.shm_tests.window``)."""
    with window_store(namespace, rows=store_rows) as st:
        yield st
