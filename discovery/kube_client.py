"""The Kubernetes API client discovery uses: its configuration, and its connections.

:func:`track_requests` records which connection each thread is using, so that stopping
an informer can cut the request its thread is blocked in.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.incluster_config import InClusterConfigLoader

__all__ = ["KubeConfigError", "RequestTracker", "load_client", "track_requests"]

_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeConfigError(RuntimeError):
    """No usable Kubernetes client configuration (no kubeconfig, not in a cluster)."""



def load_client(
    kubeconfig: str = "",
    *,
    service_account_dir: str = _SA_DIR,
    environ: Mapping[str, str] | None = None,
) -> tuple[k8s_client.ApiClient, str]:
    """An API client and the default namespace.

    ``kubeconfig`` given: that file (its current context's namespace). Otherwise, in a
    cluster (``KUBERNETES_SERVICE_HOST`` set), the pod's service account: the API at
    ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, verified against
    ``ca.crt`` and authenticated with ``token`` (re-read every minute, so a rotated
    token is picked up) from ``service_account_dir``, whose ``namespace`` file is the
    default namespace. Else ``$KUBECONFIG`` / ``~/.kube/config``.

    Raises
    ------
    KubeConfigError
        Naming what was tried.
    """
    env = os.environ if environ is None else environ
    cfg = k8s_client.Configuration()
    namespace = ""
    in_cluster = not kubeconfig and bool(env.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            InClusterConfigLoader(
                token_filename=os.path.join(service_account_dir, "token"),
                cert_filename=os.path.join(service_account_dir, "ca.crt"),
                environ=env,
            ).load_and_set(cfg)
            try:
                with open(os.path.join(service_account_dir, "namespace"), encoding="utf-8") as fh:
                    namespace = fh.read().strip()
            except OSError:
                namespace = ""
        else:
            path = kubeconfig or None
            k8s_config.load_kube_config(
                config_file=path, client_configuration=cfg, persist_config=False
            )
            _, current = k8s_config.list_kube_config_contexts(path)
            namespace = (current or {}).get("context", {}).get("namespace", "") or ""
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = kubeconfig or (
            f"in-cluster service account in {service_account_dir}"
            if in_cluster
            else "default kubeconfig"
        )
        raise KubeConfigError(f"cannot load Kubernetes configuration ({where}): {exc}") from None
    # Retries are ours (jittered backoff, logged); urllib3 must not retry silently.
    cfg.retries = False
    return k8s_client.ApiClient(cfg), namespace or "default"




class RequestTracker:
    """The connection each thread has checked out of one API client's pools.

    The ``kubernetes`` client blocks in urllib3 while a request waits for an answer; the
    only way to end that wait early is to shut the socket down. urllib3 does not say
    which connection a request uses, so :func:`track_requests` makes the client's pools
    report every connection they hand out and take back, by thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_thread: dict[int, Any] = {}

    def checked_out(self, conn: Any) -> None:
        """A pool handed ``conn`` to the calling thread."""
        with self._lock:
            self._by_thread[threading.get_ident()] = conn

    def returned(self, conn: Any) -> None:
        """The calling thread gave ``conn`` back (``None``: it was closed instead)."""
        with self._lock:
            ident = threading.get_ident()
            if conn is None or self._by_thread.get(ident) is conn:
                self._by_thread.pop(ident, None)

    def interrupt(self, thread_ident: int) -> bool:
        """Shut down the socket the thread ``thread_ident`` is using; True if it had one."""
        with self._lock:
            conn = self._by_thread.get(thread_ident)
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is None:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True


def track_requests(api: k8s_client.ApiClient) -> RequestTracker:
    """The :class:`RequestTracker` of ``api`` (installed on first use).

    Replaces the pool classes of the client's urllib3 pool manager by subclasses that
    report :meth:`~urllib3.HTTPConnectionPool._get_conn` and ``_put_conn`` (urllib3 1.26
    and 2.x have both). A urllib3 without them gets a tracker that knows nothing: a stop
    then waits for the request's read timeout, as before.
    """
    pm = api.rest_client.pool_manager
    tracker = getattr(pm, "_cslb_requests", None)
    if isinstance(tracker, RequestTracker):
        return tracker
    tracker = RequestTracker()
    classes = getattr(pm, "pool_classes_by_scheme", None)
    if not isinstance(classes, dict) or not all(
        hasattr(c, "_get_conn") and hasattr(c, "_put_conn") for c in classes.values()
    ):
        return tracker

    def tracked(base: type) -> type:
        class TrackedPool(base):  # type: ignore[misc, valid-type]
            def _get_conn(self, timeout: float | None = None) -> Any:
                conn = super()._get_conn(timeout)
                tracker.checked_out(conn)
                return conn

            def _put_conn(self, conn: Any) -> None:
                tracker.returned(conn)
                super()._put_conn(conn)

        TrackedPool.__name__ = f"Tracked{base.__name__}"
        return TrackedPool

    pm.pool_classes_by_scheme = {k: tracked(v) for k, v in classes.items()}
    pm.clear()  # pools made before this point use the old classes
    pm._cslb_requests = tracker
    return tracker
