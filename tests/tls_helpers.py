"""Certificates made by the tests (trustme): a server CA, a server certificate for 127.0.0.1, a client CA."""

from __future__ import annotations

import base64
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import trustme


@dataclass
class Certs:
    """Files of one test PKI."""

    server_ca: Path
    server_cert: Path
    server_key: Path
    client_ca: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def make_certs(directory: Path, tag: str = "") -> Certs:
    """A fresh server CA + certificate and a client CA + certificate, plus a client cert from another CA."""
    server_ca, client_ca, stranger_ca = trustme.CA(), trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1", "localhost")
    client = client_ca.issue_cert("scraper.example")
    stranger = stranger_ca.issue_cert("stranger.example")
    c = Certs(
        server_ca=directory / f"server-ca{tag}.pem",
        server_cert=directory / f"server{tag}.pem",
        server_key=directory / f"server{tag}.key",
        client_ca=directory / f"client-ca{tag}.pem",
        client_cert=directory / f"client{tag}.pem",
        client_key=directory / f"client{tag}.key",
        stranger_cert=directory / f"stranger{tag}.pem",
        stranger_key=directory / f"stranger{tag}.key",
    )
    server_ca.cert_pem.write_to_path(str(c.server_ca))
    c.server_cert.write_bytes(b"".join(p.bytes() for p in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(c.server_key))
    client_ca.cert_pem.write_to_path(str(c.client_ca))
    c.client_cert.write_bytes(b"".join(p.bytes() for p in client.cert_chain_pems))
    client.private_key_pem.write_to_path(str(c.client_key))
    c.stranger_cert.write_bytes(b"".join(p.bytes() for p in stranger.cert_chain_pems))
    stranger.private_key_pem.write_to_path(str(c.stranger_key))
    return c


def bcrypt_hash(password: str, rounds: int = 4) -> str:
    """A bcrypt hash (low cost: tests only)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


def tls_request(
    port: int,
    *,
    ca: Path | None = None,
    pin: Path | None = None,
    cert: tuple[Path, Path] | None = None,
    max_version: ssl.TLSVersion | None = None,
    curve: str | None = None,
    auth: tuple[str, str] | None = None,
    path: str = "/readyz",
) -> tuple[int, dict[str, str]]:
    """One HTTPS request over a fresh handshake: (status, headers). Raises ssl.SSLError/OSError when refused.

    `pin` trusts that server certificate itself (exporter-toolkit's server.crt, whose CA is not in the fixtures).
    """
    ctx = ssl.create_default_context(cafile=str(ca or pin))
    if pin is not None:
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    if max_version is not None:
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = max_version
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client offer old versions: the refusal must be the server's
    if curve is not None:
        ctx.set_ecdh_curve(curve)
    header = f"Authorization: Basic {base64.b64encode(f'{auth[0]}:{auth[1]}'.encode()).decode()}\r\n" if auth else ""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    if not data:
        raise ConnectionError("closed without an answer")  # TLS 1.3 reports a refused client after the handshake
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
    return int(head[0].split(" ")[1]), headers
