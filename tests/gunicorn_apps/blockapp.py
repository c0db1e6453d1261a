"""The bundled app plus ``GET /block``: a request that routes, then blocks inside track.

Every answer carries ``X-Worker-Pid``. ``/block?KEY`` routes KEY with the worker's
Router, enters ``router.track`` (in-flight +1 for the chosen endpoint, host-wide), writes
``<TEST_BLOCK_DIR>/<pid>.json`` (endpoint, row) and sleeps up to 30 s: the test SIGKILLs
the worker meanwhile.
"""

import json
import os
import time
from pathlib import Path

from workers.routing.router import Router
from workers.surfaces.app import app as cslb_app


def app(environ, start_response):
    pid = str(os.getpid())

    def respond(status, headers, exc_info=None):
        return start_response(status, [*headers, ("X-Worker-Pid", pid)], exc_info)

    if environ.get("PATH_INFO") == "/block":
        router = Router.attach()
        key = environ.get("QUERY_STRING") or "blocked-key"
        idx, table = router.route_table([key])
        with router.track(idx, table):
            info = {"endpoint": table.endpoints[int(idx[0])], "row": router.row, "pid": pid}
            mark = Path(os.environ["TEST_BLOCK_DIR"], f"{pid}.json")
            mark.with_suffix(".tmp").write_text(json.dumps(info))
            mark.with_suffix(".tmp").rename(mark)
            time.sleep(30)
        respond("200 OK", [("Content-Type", "text/plain")])
        return [b"unblocked\n"]
    return cslb_app(environ, respond)
