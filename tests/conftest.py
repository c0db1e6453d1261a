import json
import pathlib

import pytest

VECTOR_DIR = pathlib.Path(__file__).parent / "vectors" / "skipper"


def load_vectors(kind: str) -> list[tuple[str, dict]]:
    out = []
    for path in sorted(VECTOR_DIR.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc["kind"] == kind:
            out.append((path.name, doc))
    return out


@pytest.fixture(scope="session")
def vector_dir() -> pathlib.Path:
    return VECTOR_DIR


KERNELS = ("native", "numpy")


@pytest.fixture(params=KERNELS)
def kernel(request):
    """Run the test once per lbcore kernel (``lbcore.use_kernel``), restoring the old one.

    Plans built inside the test route on the selected kernel; so do ``lbcore.hash_keys``
    and ``lbcore.scatter_add``.
    """
    import lbcore

    old = lbcore.use_kernel(request.param)
    try:
        yield request.param
    finally:
        lbcore.use_kernel(old)


@pytest.fixture
def kube_bookmark_s() -> float | None:
    """Seconds between the bookmarks the ``kube`` fixture's server sends on open watches
    (``None``: only when a test asks); a module may override it. Bookmarks keep quiet
    watches inside the informers' read timeout."""
    return 0.3


@pytest.fixture
def kube(kube_bookmark_s):
    """The test Kubernetes API server (:mod:`tests.kubeapi`) on 127.0.0.1, stopped after."""
    from tests.kubeapi import FakeKubeAPI

    with FakeKubeAPI(bookmark_every_s=kube_bookmark_s) as api:
        yield api


@pytest.fixture
def reports_on(monkeypatch):
    """Pods' load reports on, counted at once (no blackout), for this test only.

    Workers read the report settings once per process: cleared before and after.
    """
    from workers.routing import reported

    monkeypatch.setenv("CSLB_LOAD_REPORTS", "on")
    monkeypatch.setenv("CSLB_LOAD_REPORT_BLACKOUT", "0")
    reported.report_settings.cache_clear()
    yield
    reported.report_settings.cache_clear()
