"""A test certificate authority for the API server's TLS, made with the ``openssl`` CLI."""

from __future__ import annotations

import os
import subprocess


def make_test_ca(directory: str) -> tuple[str, str, str]:
    """A test CA and a server certificate for 127.0.0.1 / localhost, made with ``openssl``.

    Returns the paths of (CA certificate, server certificate, server key).
    """

    from tests.tools import need

    openssl = need("openssl")  # skips (or fails under CSLB_REQUIRE_TOOLS=1) without it

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    ca_key, ca_crt = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.crt")
    key, csr = os.path.join(directory, "server.key"), os.path.join(directory, "server.csr")
    crt, ext = os.path.join(directory, "server.crt"), os.path.join(directory, "server.ext")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        ca_key,
        "-out",
        ca_crt,
        "-days",
        "2",
        "-subj",
        "/CN=cslb test CA",
    )
    run("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=kube-apiserver")
    with open(ext, "w", encoding="utf-8") as fh:
        fh.write(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n"
        )
    run(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca_crt,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-out",
        crt,
        "-days",
        "2",
        "-extfile",
        ext,
    )
    return ca_crt, crt, key
