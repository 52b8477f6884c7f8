"""TLS server contexts from a checked web config, swapped per handshake so a reload takes effect at once.

hypercorn hands one SSLContext to asyncio at start, and asyncio calls its `wrap_bio` for every new connection
(asyncio/sslproto.py). `LiveContext` forwards that call to the newest context, so every handshake after a reload
uses a context built from scratch: a removed client CA is gone, not merely joined by the new one (adding the new
bundle to the old context, as jaxmon once did, kept trusting the old CA). exporter-toolkit does the same per
handshake with GetConfigForClient (web/tls_config.go).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxmon.web.config_error import WebConfigError


@dataclass(frozen=True)
class TLSSettings:
    """A checked TLS section: where the certificate, key and client CAs come from, and the policy."""

    cert_file: Path | None
    key_file: Path | None
    cert_pem: str
    key_pem: str
    client_ca_file: Path | None
    client_ca_pem: str
    client_auth: str  # NoClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert
    min_version: str
    max_version: str
    curve: str | None  # the OpenSSL name of the one curve to offer; None: OpenSSL's defaults
    prefer_server_ciphers: bool
    allowed_sans: frozenset[str] | None

    def files(self) -> list[Path]:
        """The files this TLS config reads."""
        return [f for f in (self.cert_file, self.key_file, self.client_ca_file) if f is not None]


_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_VERIFY = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


def peer_sans(cert: dict[str, Any]) -> set[str]:
    """The SAN values Go's VerifyPeerCertificate in the toolkit compares: DNS names, emails, IPs, URIs."""
    out: set[str] = set()
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address":
            # Python writes IPv6 uncompressed and upper case; Go's net.IP.String() compresses it.
            with contextlib.suppress(ValueError):
                value = str(ipaddress.ip_address(value.strip()))
            out.add(value)
        elif kind in ("DNS", "email", "URI"):
            out.add(value)
    return out


class _SanCheckedObject(ssl.SSLObject):
    """An SSLObject whose handshake fails when the verified client certificate has none of the allowed SANs."""

    def do_handshake(self) -> None:
        super().do_handshake()
        allowed = getattr(self.context, "allowed_sans", None)
        if allowed is None:
            return
        found = peer_sans(self.getpeercert() or {})
        if not found & allowed:
            # asyncio's sslproto closes the connection on this error, as a failed handshake.
            raise ssl.SSLError(f"client certificate SANs {sorted(found)} include none of client_allowed_sans")


class ServerContext(ssl.SSLContext):
    """A server context that also carries the SANs a client certificate must have (None: any)."""

    allowed_sans: frozenset[str] | None = None


ServerContext.sslobject_class = _SanCheckedObject


class LiveContext(ssl.SSLContext):
    """The context hypercorn holds: every new connection is wrapped by `current`, which reloads replace."""

    current: ServerContext

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        """Wrap with the newest context."""
        return self.current.wrap_bio(incoming, outgoing, server_side, server_hostname, session)


def live_context(current: ServerContext) -> LiveContext:
    """A LiveContext starting with `current`."""
    ctx = LiveContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.current = current
    return ctx


@contextlib.contextmanager
def _pem_path(file: Path | None, inline: str) -> Iterator[str]:
    """A path to read: the file, or the inline PEM in an anonymous in-memory file (never written to disk)."""
    if file is not None:
        yield str(file)
        return
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("jaxmon-pem", os.MFD_CLOEXEC)
        try:
            os.write(fd, inline.encode())
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as tmp:  # not Linux: a 0600 temporary file
        tmp.write(inline)
        tmp.flush()
        yield tmp.name


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key and block the daemon.
    raise WebConfigError("the private key is encrypted; jaxmon needs an unencrypted key")


def build_context(tls: TLSSettings) -> ServerContext:
    """A fresh server context for `tls`; WebConfigError naming the key when a file cannot be used."""
    ctx = ServerContext(ssl.PROTOCOL_TLS_SERVER)
    cert_name = f"cert_file ({tls.cert_file})" if tls.cert_file else "cert"
    key_name = f"key_file ({tls.key_file})" if tls.key_file else "key"
    try:
        with _pem_path(tls.cert_file, tls.cert_pem) as cert, _pem_path(tls.key_file, tls.key_pem) as key:
            ctx.load_cert_chain(certfile=cert, keyfile=key, password=_no_password)
    except FileNotFoundError as exc:
        missing = exc.filename or "?"
        raise WebConfigError(f"tls_server_config: failed to read {missing}: no such file") from exc
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"tls_server_config: cannot load {cert_name} / {key_name}: {exc}") from exc
    if tls.client_auth != "NoClientCert":
        try:
            if tls.client_ca_file is not None:
                ctx.load_verify_locations(cafile=str(tls.client_ca_file))
            elif tls.client_ca_pem:
                ctx.load_verify_locations(cadata=tls.client_ca_pem)
            else:
                # No client CA named: verify against the system roots, as Go does with a nil ClientCAs.
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except FileNotFoundError as exc:
            raise WebConfigError(f"tls_server_config.client_ca_file: failed to read {tls.client_ca_file}") from exc
        except (OSError, ssl.SSLError) as exc:
            where = f"client_ca_file ({tls.client_ca_file})" if tls.client_ca_file else "client_ca"
            raise WebConfigError(f"tls_server_config.{where}: cannot load: {exc}") from exc
    ctx.minimum_version = _VERSIONS[tls.min_version]
    ctx.maximum_version = _VERSIONS[tls.max_version]
    ctx.verify_mode = _VERIFY[tls.client_auth]
    ctx.options |= ssl.OP_NO_COMPRESSION
    if tls.prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve is not None:
        ctx.set_ecdh_curve(tls.curve)
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.allowed_sans = tls.allowed_sans
    return ctx
