"""The status page: rendered from real shared memory, parsed, and laid out by Chromium."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

import shm
from lbcore.ejection import Ejections
from lbcore.outlier import REASON_FAILURE_PERCENTAGE
from tests.app_tests.conftest import ENDPOINTS, Host, new_namespace
from tests.chromium import run_chromium
from workers.surfaces.app import CslbApp
from workers.surfaces.hosts import EndpointState, Health, HostMonitor, HostSnapshot
from workers.surfaces.status import render

NEW = "http://10.9.1.1:8080"


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self.text = ""

    def find_all(self, pred) -> list[Element]:
        out = [self] if pred(self) else []
        for c in self.children:
            out += c.find_all(pred)
        return out

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)

    def width_pct(self) -> float:
        m = re.search(r"width:\s*([0-9.]+)%", self.attrs.get("style", ""))
        assert m, self.attrs
        return float(m.group(1))


class Tree(HTMLParser):
    VOID = frozenset({"meta", "br", "img", "input", "link", "hr"})

    def __init__(self, html: str) -> None:
        super().__init__()
        self.root = Element("#root", {}, None)
        self.cur = self.root
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        el = Element(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(el)
        if tag not in self.VOID:
            self.cur = el

    def handle_endtag(self, tag):
        el = self.cur
        while el is not None and el.tag != tag:
            el = el.parent
        if el is not None and el.parent is not None:
            self.cur = el.parent

    def handle_data(self, data):
        self.cur.text += data

    def by_class(self, name: str) -> list[Element]:
        return self.root.find_all(lambda e: name in e.classes())

    def by_id(self, name: str) -> Element:
        (el,) = self.root.find_all(lambda e: e.attrs.get("id") == name)
        return el


def bars(tree: Tree) -> dict[str, tuple[float, float]]:
    """endpoint -> (data-occupancy, fill width %) of every occupancy bar."""
    out = {}
    for bar in tree.by_class("bar"):
        if "data-endpoint" not in bar.attrs:
            continue
        (fill,) = [c for c in bar.children if "fill" in c.classes()]
        out[bar.attrs["data-endpoint"]] = (float(bar.attrs["data-occupancy"]), fill.width_pct())
    return out


def ring_age(row: Element) -> float:
    """Seconds since the fading ring of a table row started, as the page says."""
    cells = [td.all_text() for td in row.find_all(lambda e: e.tag == "td")]
    (age,) = [m.group(1) for c in cells if (m := re.fullmatch(r"([0-9.]+) s of 30 s", c))]
    return float(age)


def loaded_host(host: Host, signal: str = "occupancy") -> None:
    # Published 3 s ago; the ring started fading 12 s before that (15 s ago).
    host.publish(
        fading=[([NEW], 12.0)],
        knobs=shm.Knobs(balance_factor=1.25, percentage=50.0, load_signal=signal),
        now_ns=time.monotonic_ns() - 3_000_000_000,
    )
    host.busy(ENDPOINTS[0], 8.0, calls=8)  # occupancy 0.8
    host.busy(ENDPOINTS[1], 4.0, calls=4, failed=1)  # 0.4
    host.busy(ENDPOINTS[2], 2.0, calls=2)  # 0.2
    host.recorder.count(1000, 10, 5)


def test_bars_widths_rings_knobs_and_age(host: Host) -> None:
    loaded_host(host)
    html = render(HostMonitor(host.namespace).snapshot())
    tree = Tree(html)
    got = bars(tree)
    assert set(got) == {*ENDPOINTS, NEW}
    occ = {e: o for e, (o, _) in got.items()}
    assert occ[ENDPOINTS[0]] == pytest.approx(0.8, abs=0.02)
    assert occ[ENDPOINTS[1]] == pytest.approx(0.4, abs=0.02)
    assert occ[ENDPOINTS[2]] == pytest.approx(0.2, abs=0.02)
    assert occ[ENDPOINTS[3]] == 0.0
    # Full width is 1.0 busy-seconds per second here (nothing is above it).
    for e, (o, width) in got.items():
        assert width == pytest.approx(100 * o, abs=0.06), e
    # The load bounded load compares: occupancy, the failed call of ENDPOINTS[1] counted
    # as a call of the host's mean latency (1 s: +0.1), so a failing pod never looks idle.
    cells = tree.root.find_all(lambda e: "data-load" in e.attrs)
    load = dict(zip([*ENDPOINTS, NEW], (float(c.attrs["data-load"]) for c in cells), strict=True))
    assert load[ENDPOINTS[1]] == pytest.approx(0.5, abs=0.02)
    assert all(load[e] == pytest.approx(occ[e], abs=1e-9) for e in occ if e != ENDPOINTS[1])
    # The bounded-load bar the routers use: 1.25 x (increment + total load) / 7
    # endpoints, the increment being the routed call's share of the window: every call
    # took 1 s, the window is 10 s, so 0.1 (Skipper's 1 would put the bar at 0.45 and
    # leave the 0.5 pod cool).
    bar = 1.25 * (1.0 / 10.0 + sum(load.values())) / len(load)
    (limit,) = {m.attrs["style"] for m in tree.by_class("limit")}
    assert float(re.search(r"left:([0-9.]+)%", limit).group(1)) == pytest.approx(
        100 * bar, abs=0.06
    )
    hot = {b.parent.attrs["data-endpoint"] for b in tree.by_class("hot")}
    assert hot == {e for e, v in load.items() if v > bar} == {ENDPOINTS[0], ENDPOINTS[1]}
    assert "× (0.1 + total occupancy load) / 7 endpoints" in tree.by_id("load-bar").all_text()
    # The fading ring: 15 s of 30 s, share 0.5 ** 2.5.
    (ring,) = tree.by_class("fading")
    assert ring.attrs["data-ring"] == "1"
    assert float(ring.attrs["data-share"]) == pytest.approx(0.5**2.5, abs=0.03)
    (progress,) = [e for e in ring.find_all(lambda e: "fill" in e.classes())]
    assert progress.width_pct() == pytest.approx(50.0, abs=3.0)
    assert NEW in ring.all_text()
    # Knobs, generation, age, health, totals.
    assert tree.by_id("knob-percentage").all_text() == "50"
    assert tree.by_id("knob-balance_factor").all_text() == "1.25"
    assert tree.by_id("knob-fade_mode").all_text() == "n-ring"
    assert tree.by_id("generation").all_text() == "1"
    assert 2.9 <= float(tree.by_id("table-age").all_text()) <= 4.0
    assert tree.by_id("health").all_text() == "healthy"
    assert "1000 keys routed, 10 fallback, 5 moved" in html
    assert '<meta http-equiv="refresh" content="5">' in html
    # Self-contained: one inline script (allowed by hash, nothing else), no external
    # asset of any kind.
    assert html.count("<script") == 1 and "script-src 'sha256-" in html
    for needle in ("src=", "href=", "url(", "@import", "<link"):
        assert needle not in html, needle
    static = render(HostMonitor(host.namespace).snapshot(), refresh_s=None)
    assert "<script" not in static and "refresh" not in static


def test_load_bar_follows_the_tables_load_signal() -> None:
    """Red marks the endpoints over bounded load's bar in the unit of the
    table's load signal; the mark on the occupancy bars appears only for occupancy."""
    for signal in ("effective", "in-flight", "occupancy"):
        host = Host(new_namespace())  # a fresh host per signal: no load left over
        try:
            loaded_host(host, signal)
            host.open(ENDPOINTS[3], 3)  # 3 open calls: a load of 3 (not occupancy)
            tree = Tree(render(HostMonitor(host.namespace).snapshot()))
        finally:
            host.close()
        hot = {b.parent.attrs["data-endpoint"] for b in tree.by_class("hot")}
        text = tree.by_id("load-bar").all_text()
        if signal == "occupancy":
            # 0.8 and 0.4 > 1.25 x (0.1 + 1.4) / 7: the routed call adds 1 s / 10 s.
            assert hot == set(ENDPOINTS[:2]) and len(tree.by_class("limit")) == len(ENDPOINTS) + 1
            assert "(0.1 + total" in text
        else:
            assert hot == {ENDPOINTS[3]}, signal  # 3 > 1.25 x (1 + ~4.4) / 7
            assert tree.by_class("limit") == []
            assert "(1 + total" in text
        assert f"total {signal} load" in tree.by_id("load-bar").all_text()
        cells = tree.root.find_all(lambda e: "data-load" in e.attrs)
        loads = [float(td.attrs["data-load"]) for td in cells]
        assert loads[3] == pytest.approx(3.0 if signal != "occupancy" else 0.0, abs=0.01)


def test_scale_grows_with_the_hottest_endpoint() -> None:
    eps = tuple(
        EndpointState(
            f"ep{i}",
            "z",
            "n",
            i,
            0,
            False,
            in_flight=0,
            occupancy=occ,
            requests_total=0,
            failures_total=0,
        )
        for i, occ in enumerate([3.0, 1.5, 0.0])
    )
    snap = HostSnapshot(
        "ns", 0, Health(True, "ok"), True, 1, 1.0, 0.1, 1, True, 5.0, {}, (), eps, True
    )
    got = bars(Tree(render(snap)))
    assert got["ep0"][1] == pytest.approx(100.0)
    assert got["ep1"][1] == pytest.approx(50.0)
    assert got["ep2"][1] == 0.0


def test_strings_from_shared_memory_are_escaped() -> None:
    evil = '<script>alert("x")</script>'
    eps = (
        EndpointState(
            evil,
            "<b>z</b>",
            "n&m",
            0,
            0,
            True,
            in_flight=0,
            occupancy=0.5,
            latency_s=0.01,
            requests_total=1,
            failures_total=0,
        ),
    )
    snap = HostSnapshot(
        "ns", 0, Health(False, "reason <i>"), True, 1, 1.0, 9.0, 1, False, 5.0, {}, (), eps, True
    )
    html = render(snap, refresh_s=None)
    assert "<script" not in html and "<b>z" not in html and "<i>" not in html
    live = render(snap)  # with its own script: the evil one still escaped
    assert evil not in live and live.count("<script") == 1
    assert "&lt;script&gt;" in html and "n&amp;m" in html
    assert "refresh" not in html
    tree = Tree(html)
    assert set(bars(tree)) == {evil}
    assert tree.by_id("health").all_text() == "unhealthy: reason <i>"


def test_ejected_pods_show_why_and_until_when_and_panic_is_named(host: Host) -> None:
    e = Ejections.none(len(ENDPOINTS))
    reason, until, counts = e.reason.copy(), e.until_ns.copy(), e.counts.copy()
    reason[2] = REASON_FAILURE_PERCENTAGE
    until[2] = time.monotonic_ns() + 42 * 10**9
    counts[2] = [1, 2, 0]
    counts[4] = [0, 0, 1]
    state = Ejections.of(reason, until, e.multiplier, e.decay_ns, counts)
    host.publish(ejections=state)
    tree = Tree(render(HostMonitor(host.namespace).snapshot()))
    cells = tree.by_class("outlier")
    assert len(cells) == len(ENDPOINTS)
    text = cells[2].all_text()
    assert text.startswith("ejected: failure percentage, ") and "3 ejections so far" in text
    left = int(re.search(r"(\d+) s left", text).group(1))
    assert 38 <= left <= 42
    assert cells[2].parent.classes() >= {"ejected"}
    assert cells[4].all_text() == "1 ejection so far" and cells[0].all_text() == "–"
    assert tree.root.find_all(lambda el: el.attrs.get("id") == "outlier-panic") == []
    host.publish(ejections=state, outlier_panic=True)
    tree = Tree(render(HostMonitor(host.namespace).snapshot()))
    assert "routing ignores every ejection" in tree.by_id("outlier-panic").all_text()
    row = tree.by_class("outlier")[2]
    assert row.all_text().startswith("ejected, ignored (panic): failure percentage")
    assert "ejected" not in row.parent.classes()


def test_no_tables(namespace: str) -> None:
    tree = Tree(render(HostMonitor(namespace).snapshot()))
    assert "no routing tables" in tree.by_id("health").all_text()
    assert tree.by_id("table-age").all_text() == "nothing published yet"
    assert bars(tree) == {}
    assert tree.by_id("no-endpoints") and tree.by_id("no-fading")


# --------------------------------------------------------------------------------------
# Served over HTTP and rendered by headless Chromium.


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """The app on a real wsgiref server on 127.0.0.1 (free port), in a thread."""
    server: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


def chromium(args: list[str], tmp_path: Path) -> str:
    return run_chromium(args, tmp_path / "profile")


# Appended by the test (the page itself has no script): measures the laid-out bars.
MEASURE = """<script>
for (const bar of document.querySelectorAll('.bar[data-endpoint]')) {
  const fill = bar.querySelector('.fill');
  bar.dataset.barPx = bar.getBoundingClientRect().width;
  bar.dataset.fillPx = fill.getBoundingClientRect().width;
  bar.dataset.fillColor = getComputedStyle(fill).backgroundColor;
}
for (const row of document.querySelectorAll('tr.fading')) {
  row.dataset.fillPx = row.querySelector('.fill').getBoundingClientRect().width;
}
</script>"""


def test_renders_in_headless_chromium(host: Host, tmp_path: Path) -> None:
    from tests.tools import need

    need("chromium", "chromium-browser")  # skips, or fails under CSLB_REQUIRE_TOOLS=1
    loaded_host(host)
    app = CslbApp(host.namespace)
    # A live publisher heartbeats while Chromium starts (seconds on a loaded machine), so
    # the page's health line reflects the host, not how long the browser took.
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.2):
            host.writer.heartbeat()

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        with serve(app) as base:
            dom = chromium(["--dump-dom", f"{base}/status"], tmp_path)
            with urllib.request.urlopen(f"{base}/status?refresh=0", timeout=10) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
                page = resp.read().decode()
    finally:
        stop.set()
        beater.join()
        app.close()
    # The DOM Chromium built from the served page: a bar per endpoint, widths as sent.
    tree = Tree(dom)
    got = bars(tree)
    assert set(got) == {*ENDPOINTS, NEW}
    for e, (o, width) in got.items():
        assert width == pytest.approx(100 * o, abs=0.06), e
    assert tree.by_id("health").all_text() == "healthy"
    # The fading ring's progress, the knobs and the table age, as rendered.
    (ring,) = tree.by_class("fading")
    age = ring_age(ring)  # 15 s and what the page took (seconds, on a busy machine)
    assert NEW in ring.all_text() and 15.0 <= age < 45.0
    (progress,) = ring.find_all(lambda e: "fill" in e.classes())
    assert progress.width_pct() == pytest.approx(100 * min(age / 30, 1.0), abs=0.4)
    assert float(ring.attrs["data-share"]) == pytest.approx(min(age / 30, 1) ** 2.5, abs=0.01)
    assert tree.by_id("knob-percentage").all_text() == "50"
    assert tree.by_id("knob-balance_factor").all_text() == "1.25"
    assert tree.by_id("knob-load_signal").all_text() == "occupancy"
    assert tree.by_id("generation").all_text() == "1"
    assert 2.9 <= float(tree.by_id("table-age").all_text()) <= 10.0
    # Laid out: the fills' pixel widths are proportional to occupancy.
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    tree = Tree(chromium(["--dump-dom", measured.as_uri()], tmp_path))
    laid = {
        b.attrs["data-endpoint"]: (
            float(b.attrs["data-occupancy"]),
            float(b.attrs["data-bar-px"]),
            float(b.attrs["data-fill-px"]),
            b.attrs["data-fill-color"],
        )
        for b in tree.by_class("bar")
        if "data-endpoint" in b.attrs
    }
    assert set(laid) == {*ENDPOINTS, NEW}
    for e, (o, bar_px, fill_px, color) in laid.items():
        assert bar_px == 200.0, e
        assert fill_px == pytest.approx(200.0 * o, abs=1.0), e
        assert color in ("rgb(46, 111, 216)", "rgb(217, 72, 15)"), color
    assert laid[ENDPOINTS[0]][2] > laid[ENDPOINTS[1]][2] > laid[ENDPOINTS[2]][2] > 33
    (ring,) = tree.by_class("fading")
    want = 200.0 * min(ring_age(ring) / 30, 1.0)  # of the page fetched above
    assert float(ring.attrs["data-fill-px"]) == pytest.approx(want, abs=1.5)


def test_status_served_with_refresh_parameter(host: Host) -> None:
    host.publish()
    app = CslbApp(host.namespace)
    try:
        with serve(app) as base:
            with urllib.request.urlopen(f"{base}/status?refresh=2", timeout=10) as resp:
                assert '<meta http-equiv="refresh" content="2">' in resp.read().decode()
            with urllib.request.urlopen(f"{base}/status?refresh=0", timeout=10) as resp:
                assert "refresh" not in resp.read().decode()
            t0 = time.monotonic()
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{base}/status?refresh=soon", timeout=10)
            assert err.value.code == 400
            assert "refresh must be a number" in json.loads(err.value.read())["error"]
            for bad in ("nan", "inf", "-1"):
                with pytest.raises(urllib.error.HTTPError) as err:
                    urllib.request.urlopen(f"{base}/status?refresh={bad}", timeout=10)
                assert err.value.code == 400
            assert time.monotonic() - t0 < 5
    finally:
        app.close()


def test_idle_host_draws_no_load_bar(host: Host) -> None:
    host.publish()
    tree = Tree(render(HostMonitor(host.namespace).snapshot()))
    assert {o for o, _ in bars(tree).values()} == {0.0}
    assert tree.by_class("limit") == [] and tree.by_class("hot") == []


def test_status_marks_ejected_and_fading_endpoints(host: Host) -> None:
    host.publish(fading=[([NEW], 5.0)], ejected=[i == 1 for i in range(len(ENDPOINTS) + 1)])
    tree = Tree(render(HostMonitor(host.namespace).snapshot()))
    rows = {r.attrs["data-endpoint"]: r for r in tree.by_class("pod") if r.tag == "tr"}
    assert "ejected" in rows[ENDPOINTS[1]].classes()
    assert "ejected" not in rows[ENDPOINTS[0]].classes()
    (cell,) = rows[NEW].find_all(lambda e: e.tag == "small")
    assert cell.all_text() == "no node · fading 1"


def test_table_age_is_not_heartbeat_age_on_the_page(host: Host) -> None:
    host.publish(now_ns=time.monotonic_ns() - 20_000_000_000)
    host.writer.heartbeat()
    tree = Tree(render(HostMonitor(host.namespace).snapshot()))
    assert float(tree.by_id("table-age").all_text()) >= 20.0
    assert tree.by_id("health").all_text() == "healthy"
