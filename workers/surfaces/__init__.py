"""What people and tools see of a host: its HTTP surfaces and the reports the CLI prints.

* :mod:`workers.surfaces.app`: the bundled WSGI app (``workers.app:app``).
* :mod:`workers.surfaces.body`: reading and parsing the request bodies of ``/route``.
* :mod:`workers.surfaces.mount`: ``mount()``: cslb's paths beside your app.
* :mod:`workers.surfaces.hosts`: the host monitor, and the one copy of a table's
  per-endpoint rows every surface shows (:func:`~workers.surfaces.hosts.read_table`).
* :mod:`workers.surfaces.collector`: the Prometheus collector of ``/metrics``.
* :mod:`workers.surfaces.status`: the ``/status`` page.
* :mod:`workers.surfaces.explain`: why a key routes where it does (``cslb route --live``).
* :mod:`workers.surfaces.inspect_report`: what ``cslb inspect`` prints.
"""
