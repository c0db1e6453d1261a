"""A small Kubernetes API server for tests: EndpointSlices and ConfigMaps, list + watch.

It speaks the parts of the protocol the discovery informers use, the way kube-apiserver
does: JSON lists with ``metadata.resourceVersion``; watches as chunked HTTP responses of
one JSON event per line (``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``/``ERROR``),
resumable from a resource version, ended by the server after ``timeoutSeconds``;
"too old resource version" as a 410 ``ERROR`` event (or an HTTP 410) once history was
compacted; label (``k=v``) and field (``metadata.name=x``) selectors.

Events the informer cannot decode are sent with :meth:`FakeKubeAPI.raw_event` (any type,
any object, such as a resource version that is not a number) and
:meth:`FakeKubeAPI.raw_line` (a line that is not JSON); :meth:`FakeKubeAPI.put_unannounced`
changes an object without an event, as a lost one.

Faults are injected per request: HTTP errors with a Status body, garbage bodies, a
watch that goes silent (headers sent, then nothing, connection held open), a request
that is never answered at all, a watch dropped mid-stream, a watch expired by an
``ERROR`` event, and the whole server going away and coming back on the same port.

Optionally it serves TLS (``tls=(certfile, keyfile)``; :func:`make_test_ca` writes a
test CA and a server certificate for 127.0.0.1 with the ``openssl`` CLI) and enforces
RBAC (``rbac=``, an :class:`Rbac` built from the ServiceAccount, Role and RoleBinding
manifests): a token names a service account, and any request its Role does not allow
gets kube-apiserver's 403 ``Forbidden`` Status, naming the verb and the resource.

Only listens on 127.0.0.1 (a free port). ``stop()`` ends every handler thread.

The parts: ``objects`` (resources, selectors, object builders), ``store`` (objects and their
event history), ``handler`` (HTTP: authentication, RBAC, faults, list and watch), ``server``
(listening, stopping, faults queued), ``rbac``, ``faults``, ``tls``.
"""

from tests.kubeapi.faults import Fault, Request
from tests.kubeapi.objects import (
    CONFIGMAPS,
    SLICES,
    configmap,
    endpoint,
    endpoint_slice,
    status_body,
)
from tests.kubeapi.rbac import Rbac, Rule
from tests.kubeapi.server import FakeKubeAPI
from tests.kubeapi.tls import make_test_ca

__all__ = [
    "CONFIGMAPS",
    "SLICES",
    "FakeKubeAPI",
    "Fault",
    "Rbac",
    "Request",
    "Rule",
    "configmap",
    "endpoint",
    "endpoint_slice",
    "make_test_ca",
    "status_body",
]
