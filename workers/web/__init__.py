"""The HTTP surfaces a worker serves.

* :mod:`workers.web.app`: the bundled WSGI app (``workers.app:app``).
* :mod:`workers.web.body`: reading and parsing the request bodies of ``/route``.
* :mod:`workers.web.mount`: ``mount()``: cslb's paths beside your app.
* :mod:`workers.web.hosts`: the host monitor (endpoint states from shared memory).
* :mod:`workers.web.collector`: the Prometheus collector of ``/metrics``.
* :mod:`workers.web.status`: the ``/status`` page.
* :mod:`workers.web.explain`: why a key routes where it does (``cslb route``).
"""
