"""The host's discovery process (DESIGN.md, "The rooms"): sources in, ring sets out.

* :mod:`discovery.kube` — the list+watch loop on the ``kubernetes`` client
  (:mod:`discovery.kube_client`), and :mod:`discovery.informers` on it (EndpointSlices of
  one Service, one ConfigMap of knobs);
* :mod:`discovery.endpoints` — EndpointSlices to addresses by Skipper's rules;
* :mod:`discovery.static` — endpoints files and lists, and the file watcher;
* :mod:`discovery.debounce`, :mod:`discovery.ringstate` — bursts to one update, and
  membership changes to fade rings, deletions and collapses on :class:`lbcore.RingSet`;
* :mod:`discovery.settings` — process settings and the layered routing knobs;
* :mod:`discovery.service` — the loop; :mod:`discovery.publisher` — the only module
  that talks to :mod:`shm`'s writer;
* :mod:`discovery.cli` (``cslb discovery``), :mod:`discovery.events` (JSON-lines logs).
  ``cslb inspect`` reads what was published on the workers' side
  (:mod:`workers.surfaces.inspect_report`).

Importing this package imports nothing; only :mod:`discovery.kube` and the modules and
CLI that use it load the Kubernetes client, so worker-side code never does.
"""
