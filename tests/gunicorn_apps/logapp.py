"""A user app for the log tests: each request routes two keys and records one failed call.

So each request makes its worker write a cslb line (the router's rate-limited failure
line), and the answer says what the worker's root and ``cslb`` loggers look like.
"""

import json
import logging
import os

from workers import Router


def app(environ, start_response):
    router = Router.attach()
    keys = ["SKU-1", "SKU-2"]
    idx, table = router.route_table(keys)
    with router.track(idx, table, keys) as t:
        t.fail(0)
    root = logging.getLogger()
    cslb = logging.getLogger("cslb")
    body = json.dumps(
        {
            "pid": os.getpid(),
            "routed": [int(i) for i in idx],
            "root": {"handlers": [type(h).__name__ for h in root.handlers], "level": root.level},
            "cslb": {
                "handlers": [type(h).__name__ for h in cslb.handlers],
                "propagate": cslb.propagate,
            },
        }
    ).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
