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
