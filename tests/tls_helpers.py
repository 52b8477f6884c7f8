"""Certificates made by the tests (trustme): a server CA, a server certificate for 127.0.0.1, a client CA."""

from __future__ import annotations

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
