"""Tiny WSGI app for gunicorn tests: says which process answered and its counter row."""

import json
import os


def app(environ, start_response):
    body = json.dumps(
        {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "row": os.environ.get("CSLB_COUNTER_ROW"),
            "marker": os.environ.get("TEST_MARKER"),
        }
    ).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
