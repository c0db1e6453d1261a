"""The pods' load-report wire format, shared by the pods, the callers and discovery.

* :mod:`lbwire.orca`: ORCA's ``endpoint-load-metrics`` (``TEXT``, ``JSON``, ``BIN``,
  ``endpoint-load-metrics-bin``) and W3C ``Server-Timing``: formatting for the pods
  (:mod:`workers.serving`), strict parsing for the callers (:mod:`workers.fanout.reports`)
  and for the discovery process's refreshes (:mod:`discovery.loadrefresh`);
* :mod:`lbwire.protowire`: the ``BIN`` form's protobuf decoder.

Standard library only, and nothing of cslb's: every room may import it.
"""
