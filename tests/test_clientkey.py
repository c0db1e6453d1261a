import pytest

import lbcore


@pytest.mark.parametrize(
    ("xff", "remote", "want"),
    [
        ("::ffff:10.1.2.3", "1.1.1.1:1", "10.1.2.3"),
        ("[2001:db8::1]:443", "1.1.1.1:1", "2001:db8::1"),
        ("2001:0db8:0000:0000:0000:0000:0000:0001", "x", "2001:db8::1"),
        ("fe80::1%eth0", "1.1.1.1:1", "1.1.1.1"),
        ("010.0.0.1", "1.1.1.1:1", "1.1.1.1"),
        ("10.0.0.1 ", "1.1.1.1:1", "1.1.1.1"),
        (None, "", "<nil>"),
        (None, "1.2.3.4", "1.2.3.4"),
        (None, "[::1]", "<nil>"),
        ("1:0:0:1:0:0:0:1", "x", "1:0:0:1::1"),
    ],
)
def test_default_key_go_forms(xff, remote, want):
    assert lbcore.default_key(xff, remote) == want
