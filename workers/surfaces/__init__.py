"""The HTTP surfaces a worker serves.

* :mod:`workers.surfaces.app`: the bundled WSGI app (``workers.app:app``).
* :mod:`workers.surfaces.body`: reading and parsing the request bodies of ``/route``.
* :mod:`workers.surfaces.mount`: ``mount()``: cslb's paths beside your app.
* :mod:`workers.surfaces.hosts`: the host monitor (endpoint states from shared memory).
* :mod:`workers.surfaces.collector`: the Prometheus collector of ``/metrics``.
* :mod:`workers.surfaces.status`: the ``/status`` page.
* :mod:`workers.surfaces.explain`: why a key routes where it does (``cslb route``).
"""
