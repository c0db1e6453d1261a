"""Faults injected per request, and the requests the server saw."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Fault:
    """What to do instead of answering normally.

    ``action``: ``status`` (HTTP ``code`` with a Status body), ``garbage`` (200 with a
    body that is not JSON / a watch line that is not JSON), ``silent`` (watch: headers,
    ``events`` real events, then nothing while holding the connection), ``drop`` (watch:
    headers, ``events`` events, half a chunk, then close), ``reset`` (close without an
    answer), ``gone`` (HTTP 410), ``expired`` (watch: a 200 whose stream is one 410
    ``ERROR`` event), ``hang`` (read the request, then answer nothing, not even headers,
    while holding the connection), ``bad-rv`` (list: a resourceVersion that is not a
    number).
    """

    op: str  # "list" | "watch" | "any"
    resource: str
    action: str
    code: int = 500
    times: int = 1  # -1: until cleared
    events: int = 0
    hits: int = 0


@dataclass
class Request:
    """One request the server received."""

    op: str
    resource: str
    namespace: str
    query: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)
    t: float = 0.0
