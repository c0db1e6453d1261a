import os
import stat
import threading

import numpy as np
import pytest

from shm import (
    NamespaceError,
    SegmentExistsError,
    SegmentFullError,
    SegmentMagicError,
    SegmentMissingError,
    SegmentPermissionError,
    SegmentSizeError,
    SegmentVersionError,
    check_namespace,
    list_segments,
    segment_name,
)
from shm.layout import (
    LAYOUT_VERSION,
    MAGIC_COUNTERS_CONTROL,
    MAGIC_TABLES_CONTROL,
    TABLES_CONTROL,
)
from shm.names import SHM_DIR
from shm.owners import process_alive, process_start_ticks
from shm.segment import Segment, check_header


@pytest.mark.parametrize("ns", ["prapi", "a", "A-b_9", "x" * 64])
def test_valid_namespaces(ns):
    assert check_namespace(ns) == ns
    assert segment_name(ns, "tables") == f"/cslb.{ns}.tables"
    assert segment_name(ns, "tables", 3) == f"/cslb.{ns}.tables.3"


@pytest.mark.parametrize("ns", ["", "a.b", "a/b", "x" * 65, "ü", "a b", "../x", None, 5])
def test_invalid_namespaces_name_the_problem(ns):
    with pytest.raises(NamespaceError, match="namespace"):
        segment_name(ns, "tables")


def test_create_is_owner_only_whatever_the_umask(namespace):
    name = segment_name(namespace, "probe")
    old = os.umask(0)
    try:
        seg = Segment.create(name, 8192)
    finally:
        os.umask(old)
    try:
        st = os.stat(SHM_DIR + name)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.geteuid()
        assert seg.size == 8192 and seg.writable and seg.created
        assert list_segments(namespace) == [name]
        with pytest.raises(SegmentExistsError, match=name):
            Segment.create(name, 8192)
    finally:
        seg.unlink()
        seg.close()
    assert list_segments(namespace) == []


def test_attach_missing_names_the_segment(namespace):
    name = segment_name(namespace, "tables")
    with pytest.raises(SegmentMissingError, match=f"segment {name}: does not exist"):
        Segment.attach(name)


def test_attach_refuses_a_segment_others_may_write(namespace):
    name = segment_name(namespace, "probe")
    seg = Segment.create(name, 4096)
    try:
        os.chmod(SHM_DIR + name, 0o666)
        with pytest.raises(SegmentPermissionError, match="0666"):
            Segment.attach(name)
    finally:
        seg.unlink()


def test_read_only_attach_cannot_write(namespace):
    name = segment_name(namespace, "probe")
    seg = Segment.create(name, 4096)
    try:
        ro = Segment.attach(name)
        view = ro.array(np.uint64, 0, 4)
        with pytest.raises(ValueError, match="read-only"):
            view[0] = 1
        seg.words[0] = 42
        assert int(view[0]) == 42  # shared, not copied
    finally:
        seg.unlink()


def test_full_dev_shm_is_a_clear_error_and_leaves_nothing(namespace):
    st = os.statvfs(SHM_DIR)
    too_big = st.f_blocks * st.f_frsize + (1 << 30)
    name = segment_name(namespace, "huge")
    with pytest.raises(SegmentFullError, match=r"/dev/shm is full or too small") as info:
        Segment.create(name, too_big)
    assert info.value.segment == name
    assert list_segments(namespace) == []


def _control(namespace, fill):
    seg = Segment.create(segment_name(namespace, "tables"), 4096)
    fill(seg)
    return seg


def test_check_header_foreign_bytes(namespace):
    seg = _control(namespace, lambda s: s.array(np.uint8, 0, 4096).__setitem__(slice(None), 0xAB))
    with pytest.raises(SegmentMagicError, match="not a cslb segment"):
        check_header(seg, TABLES_CONTROL, MAGIC_TABLES_CONTROL, "a cslb tables control segment")


def test_check_header_other_kind(namespace):
    def fill(s):
        s.words[0] = MAGIC_COUNTERS_CONTROL

    seg = _control(namespace, fill)
    with pytest.raises(SegmentMagicError, match="is a cslb counters control segment, expected"):
        check_header(seg, TABLES_CONTROL, MAGIC_TABLES_CONTROL, "a cslb tables control segment")


def test_check_header_version_and_size(namespace):
    def fill(s):
        s.words[0] = MAGIC_TABLES_CONTROL
        s.words[1] = 99
        s.words[2] = 4096

    seg = _control(namespace, fill)
    with pytest.raises(
        SegmentVersionError,
        match=f"is layout version 99, this build reads version {LAYOUT_VERSION}",
    ):
        check_header(seg, TABLES_CONTROL, MAGIC_TABLES_CONTROL, "tables control")
    seg.words[1] = LAYOUT_VERSION
    seg.words[2] = 8192
    with pytest.raises(SegmentSizeError, match="header says 8192 bytes but the segment has 4096"):
        check_header(seg, TABLES_CONTROL, MAGIC_TABLES_CONTROL, "tables control")


def test_truncated_segment_is_refused_before_mapping(namespace):
    name = segment_name(namespace, "tables")
    Segment.create(name, 4096)
    os.truncate(SHM_DIR + name, 10)
    with pytest.raises(SegmentSizeError, match="is 10 bytes, too short"):
        Segment.attach(name, min_size=4096)


def test_process_identity(procs):
    me = process_start_ticks(os.getpid())
    assert me is not None and process_alive(os.getpid(), me)
    assert not process_alive(os.getpid(), me + 1)  # same PID, other start: a reused PID
    assert not process_alive(0, 0)
    p = procs.start(os.getpid)
    p.join()
    assert process_start_ticks(p.pid) is None


def test_zombie_counts_as_dead():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        for _ in range(500):
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().split(b") ")[1][:1] == b"Z":
                    break
            threading.Event().wait(0.002)
        assert process_start_ticks(pid) is None  # exited, not yet waited for
    finally:
        os.waitpid(pid, 0)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_intact_is_false_once_either_segment_shrank_and_when_unsure(namespace, native, monkeypatch):
    """The routing path's size check (one lseek per segment): shrunk or closed is not intact."""
    import shm.segment as segment

    if native and segment.intact is segment.intact_by_lseek:
        pytest.skip("the native kernel is not built here")
    if not native:
        monkeypatch.setattr(segment, "intact", segment.intact_by_lseek)
    a = Segment.create(segment_name(namespace, "probe"), 8192)
    b = Segment.create(segment_name(namespace, "probe", 1), 8192)
    try:
        assert segment.intact(a) and segment.intact(a, b) and segment.intact(b, None)
        os.truncate(SHM_DIR + b.name, 4096)
        assert segment.intact(a) and not segment.intact(a, b) and not segment.intact(b)
        assert b.shrunk_to() == 4096  # the verdict the caller then asks for
        os.truncate(SHM_DIR + b.name, 16384)  # longer than the mapping is fine
        assert segment.intact(a, b)
    finally:
        for s in (a, b):
            s.unlink()
            s.close()
    # Closed descriptors: unsure, so not intact (shrunk_to then says not shrunk).
    assert not segment.intact(a, b) and a.shrunk_to() is None


def test_native_size_check_rejects_what_is_not_two_mappings():
    import types

    import shm.segment as segment

    check = segment.intact
    if check is segment.intact_by_lseek:
        pytest.skip("the native kernel is not built here")
    with pytest.raises(TypeError):
        check()
    with pytest.raises(TypeError):
        check(None, None, None)
    with pytest.raises(AttributeError):
        check(object())

    def m(fd, size):
        return types.SimpleNamespace(fd=fd, size=size)

    # Not ints, or out of range: unsure, never a crash.
    assert check(m(0, 0), None) is True
    for bad in (m(-5, 1), m(1 << 40, 1), m(0, -1), m(1 << 80, 1 << 80), m("0", 1), m(0, 1.0)):
        assert check(bad) is False and check(m(0, 0), bad) is False
