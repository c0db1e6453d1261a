"""Calling the pods a batch routes to: ``Router.fanout`` and its parts.

* :mod:`workers.fanout.jobs`: one job per key or per pod group, as a generator (call,
  retry once, bulkhead, fallback): the description every driver runs.
* Drivers: :mod:`workers.fanout.threads` (a worker's thread pool),
  :mod:`workers.fanout.aio` (asyncio), :mod:`workers.fanout.curl_driver` (libcurl's
  multi interface over :mod:`workers.fanout.curl_transport`).
* :mod:`workers.fanout.admission` (FIFO admission of calls to a pod),
  :mod:`workers.fanout.budget` (the retry budget), :mod:`workers.fanout.ledger` (each
  call into the counter row), :mod:`workers.fanout.failurelog` (a line per failed call,
  rate-limited), :mod:`workers.fanout.settings` (``CSLB_FANOUT_*``) and
  :mod:`workers.fanout.senders` (how a call is made: libcurl, urllib3, httpx).
"""
