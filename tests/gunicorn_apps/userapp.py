"""A user's own WSGI service with its own prometheus_client metric, cslb's paths mounted
with the documented one-liner (``app = mount(app)``)."""

import json
import os
import time

from prometheus_client import Counter

from workers.surfaces.mount import mount

HELLOS = Counter("shop_hellos", "Hello requests this service answered.")


def plain(environ, start_response):
    if environ.get("PATH_INFO") != "/hello":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"the user's 404"]
    HELLOS.inc()
    if environ.get("QUERY_STRING") == "slow":
        time.sleep(0.2)  # holds this sync worker: the next request goes to another
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"hello": "from the user's app", "pid": os.getpid()}).encode()]


app = mount(plain)
