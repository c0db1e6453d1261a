"""The API server's state: objects by (resource, namespace, name), the history of events
watches replay from a resource version, compaction and bookmarks."""

from __future__ import annotations

import copy
import threading
from typing import Any

from tests.kubeapi.objects import kind_of, matches


class Store:
    """Objects and their event history, guarded by one condition the watches wait on."""

    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, str, str, str, dict[str, Any]]] = []
        self.compacted_rv = 0
        self.bookmarks_sent = 0
        self.cond = threading.Condition()

    # -- state ---------------------------------------------------------------------------

    def _record(self, resource: str, ns: str, kind: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, resource, ns, kind, copy.deepcopy(obj)))
        self.cond.notify_all()

    def put(self, resource: str, ns: str, obj: dict[str, Any]) -> int:
        """Create or replace an object (an ADDED or MODIFIED event); returns its new RV."""
        with self.cond:
            obj = copy.deepcopy(obj)
            name = obj["metadata"]["name"]
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            obj["metadata"].setdefault("namespace", ns)
            key = (resource, ns, name)
            kind = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = obj
            self._record(resource, ns, kind, obj)
            return self.rv

    def put_many(self, resource: str, ns: str, objs: list[dict[str, Any]]) -> None:
        for o in objs:
            self.put(resource, ns, o)

    def delete(self, resource: str, ns: str, name: str) -> int:
        """Delete an object (a DELETED event)."""
        with self.cond:
            obj = self.objects.pop((resource, ns, name))
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._record(resource, ns, "DELETED", obj)
            return self.rv

    def raw_event(self, resource: str, ns: str, kind: str, obj: Any) -> None:
        """Send an event with an arbitrary (possibly malformed) object; not stored."""
        with self.cond:
            self.rv += 1
            self.history.append((self.rv, resource, ns, kind, obj))
            self.cond.notify_all()

    def put_unannounced(self, resource: str, ns: str, obj: dict[str, Any]) -> int:
        """Change an object without an event: a watch never hears of it (as when an API
        server's watch cache loses one); only a list shows it."""
        with self.cond:
            obj = copy.deepcopy(obj)
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            obj["metadata"].setdefault("namespace", ns)
            self.objects[(resource, ns, obj["metadata"]["name"])] = obj
            return self.rv

    def raw_line(self, resource: str, ns: str, line: bytes) -> None:
        """Send ``line`` verbatim on the watches (an event that is not JSON, say)."""
        with self.cond:
            self.rv += 1
            self.history.append((self.rv, resource, ns, "RAW", line))
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget history: watches from an older resource version get 410."""
        with self.cond:
            self.compacted_rv = self.rv
            self.cond.notify_all()

    def bookmark(self) -> None:
        """Send a BOOKMARK with the current resource version on every open watch."""
        with self.cond:
            self.bookmarks_sent += 1
            self.cond.notify_all()

    def list_doc(self, resource: str, ns: str, sel: dict[str, str]) -> dict[str, Any]:
        with self.cond:
            items = [
                copy.deepcopy(o)
                for (r, n, _), o in sorted(self.objects.items())
                if r == resource and n == ns and matches(o, sel)
            ]
            kind = kind_of(resource)[0]
            return {
                "kind": f"{kind}List",
                "apiVersion": kind_of(resource)[1],
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
