"""The bundled app plus ``GET /kernel``: this worker's pid and routing kernel, as JSON."""

import json
import os

import lbcore
from workers.surfaces.app import app as cslb_app


def app(environ, start_response):
    if environ.get("PATH_INFO") == "/kernel":
        body = json.dumps({"pid": os.getpid(), "kernel": lbcore.kernel_name()}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    return cslb_app(environ, start_response)
