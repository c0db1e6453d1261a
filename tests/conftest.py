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
