"""``workers.app:app``: the bundled WSGI app's public spelling (:mod:`workers.surfaces.app`).

``cslb serve`` runs ``workers.app:app`` under gunicorn; the app lives in
:mod:`workers.surfaces.app`, its request bodies in :mod:`workers.surfaces.body`.
"""

from workers.surfaces.app import (
    APP_KNOBS,
    MAX_ATTEMPT,
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_KEY_BYTES,
    TEXT_CHARSETS,
    CslbApp,
    HTTPError,
    app,
    check_keys,
    pack_keys,
    parse_route_request,
    read_body,
)

__all__ = [
    "APP_KNOBS",
    "MAX_ATTEMPT",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_KEY_BYTES",
    "TEXT_CHARSETS",
    "CslbApp",
    "HTTPError",
    "app",
    "check_keys",
    "pack_keys",
    "parse_route_request",
    "read_body",
]
