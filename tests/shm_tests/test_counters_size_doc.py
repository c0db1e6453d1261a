"""The counter matrix's documented size is the size of a matrix really created.

The README's formula (bytes per cell for any window bucket count, bytes per row),
docs/kubernetes.md's sizing formula and every figure either derives from them are
checked against the data segments ``shm.CounterStore.create`` makes, so the docs
cannot drift from the layout again.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest

import shm

REPO = pathlib.Path(__file__).resolve().parents[2]
README = (REPO / "docs" / "shared-memory.md").read_text(encoding="utf-8")
K8S = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
MIB = 2**20


def _flat(text: str) -> str:
    return " ".join(text.split())


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def data_bytes(namespace: str, rows: int, columns: int, window_buckets: int = 10) -> int:
    """Size of the counters data segment of a matrix created with this geometry (bytes)."""
    store = shm.CounterStore.create(
        namespace, rows=rows, columns=columns, window_buckets=window_buckets
    )
    try:
        (data,) = [n for n in shm.list_segments(namespace) if re.search(r"\.counters\.\d+$", n)]
        return os.stat(f"/dev/shm{data}").st_size
    finally:
        store.close(unlink=True)


def readme_formula() -> tuple[int, int, int, int]:
    """(fixed words, words per bucket, default bytes per cell, bytes per row) from README."""
    flat = _flat(README)
    m = re.search(r"rows × columns × \((\d+) \+ (\d+) × \(window buckets \+ 2\)\) × 8` bytes", flat)
    assert m, "the README's counter matrix formula is missing"
    cell = re.search(r"\(([\d,]+) bytes per cell with the default 10 buckets", flat)
    row = re.search(r"plus (\d+) bytes per row", flat)
    assert cell and row
    return int(m.group(1)), int(m.group(2)), int(_num(cell.group(1))), int(row.group(1))


@pytest.mark.parametrize("window_buckets", [10, 4, 20])
def test_the_readmes_bytes_per_cell_is_the_layouts(namespace, window_buckets):
    fixed, per_bucket, default_cell, _ = readme_formula()
    doc_cell = (fixed + per_bucket * (window_buckets + 2)) * 8
    if window_buckets == 10:
        assert doc_cell == default_cell
    # 16 rows x 64 more columns is a whole number of pages for any cell size: exact.
    grown = data_bytes(namespace, 16, 128, window_buckets) - data_bytes(
        namespace, 16, 64, window_buckets
    )
    assert grown == 16 * 64 * doc_cell


def test_the_documented_row_and_cell_sizes_add_up_to_the_segment(namespace):
    _, _, cell, row = readme_formula()
    columns = 64
    # 64 rows more: a whole number of pages again, so the difference is exact
    grown = data_bytes(namespace, 128, columns) - data_bytes(namespace, 64, columns)
    assert grown == 64 * (columns * cell + row)
    # docs/kubernetes.md states the same formula for the default buckets
    m = re.search(r"rows × \(endpoint slots × ([\d,]+) B \+ (\d+) B\)", K8S)
    assert m and (int(_num(m.group(1))), int(m.group(2))) == (cell, row)
    for rows, cols in [(12, 256), (32, 1000), (5, 72)]:
        size = data_bytes(namespace, rows, cols)
        formula = rows * (cols * cell + row)
        assert formula <= size <= formula + 2 * 4096, (rows, cols)  # header, last page


def test_every_documented_counter_figure_follows_from_the_formula(namespace):
    _, _, cell, row = readme_formula()
    flat = _flat(README)

    def mib(rows: int, cols: int) -> float:
        return rows * (cols * cell + row) / MIB

    m = re.search(
        r"16 rows × 1,000 endpoint slots ([\d.]+) MiB, 32 × 1,000 ([\d.]+) MiB, "
        r"32 × 5,000 ([\d.]+) MiB",
        flat,
    )
    assert m, "the README's counter examples moved: update this test"
    for (rows, cols), doc in zip([(16, 1000), (32, 1000), (32, 5000)], m.groups(), strict=True):
        assert round(mib(rows, cols), 1) == float(doc), (rows, cols, doc)
    # the growth example: 32 rows, 256 slots before and 5,000 after
    m = re.search(r"(\d+) \+ (\d+) MiB of counters \(256 slots before, 5,000 after\)", flat)
    assert m and (int(m.group(1)), int(m.group(2))) == (round(mib(32, 256)), round(mib(32, 5000)))
    # docs/kubernetes.md's design point, measured on a real matrix
    m = re.search(r"12 counter rows × 256 slots: [\d.]+ MiB of tables and ([\d.]+) MiB", _flat(K8S))
    assert m and float(m.group(1)) == round(data_bytes(namespace, 12, 256) / MIB, 1)
