"""TLS for every NATS connection shoal makes: one `ssl.SSLContext` builder, and errors that say what to fix.

Both clients use it: nats-py (stream management, single appends, telemetry) and the log's own
protocol connection (`wire.py`: replay, follow, fold, append_many), so a setting that works for
one works for the other. The files are the settings `nats_tls_ca` (the CA that signed the
server's certificate; empty = the system's trust store) and `nats_tls_cert` + `nats_tls_key`
(this client's certificate, for servers that verify clients: mutual TLS).

A NATS server greets in plain text (INFO) and the client upgrades the same socket once INFO says
`tls_required`: the standard upgrade, the one nats-py does. An error a user can cause — a missing
or unreadable file, a file that is not PEM, a server certificate no configured CA signed, a server
that wants a client certificate — is a `TlsSetupError` or `TlsRefused` naming the setting to change.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import msgspec

SETTING_PREFIX = "nats_tls_"  # each field of TlsFiles is the setting `nats_tls_<field>`


class TlsFiles(msgspec.Struct, frozen=True, kw_only=True):
    """The PEM files of a NATS client's TLS; "" = not set. Field `f` is the setting `nats_tls_<f>`."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    @property
    def any(self) -> bool:
        return bool(self.ca or self.cert or self.key)

    @property
    def has_identity(self) -> bool:
        """A certificate and its key: what a client presents, and what an embedded server serves TLS with."""
        return bool(self.cert and self.key)


class TlsSetupError(ValueError):
    """A TLS setting names a file that cannot be used; the message says which setting and why."""


class TlsRefused(Exception):
    """The TLS handshake with a NATS server failed for a reason a setting fixes. Not an OSError on
    purpose: the readers retry those, and retrying cannot fix a setting."""


def setting(field: str) -> str:
    """`ca` -> `nats_tls_ca (env SHOAL_NATS_TLS_CA)`: how a message names a TLS setting."""
    name = SETTING_PREFIX + field
    return f"{name} (env SHOAL_{name.upper()})"


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """A client context that verifies the server (against `ca`, else the system's CAs) and, when
    `cert` and `key` are set, presents them. Built once per connection owner and reused."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if files.ca:
        _load("ca", files.ca, lambda path: context.load_verify_locations(cafile=path), "a PEM CA certificate")
    if bool(files.cert) != bool(files.key):
        missing, given = ("key", "cert") if files.cert else ("cert", "key")
        raise TlsSetupError(
            f"{setting(given)} is set but {setting(missing)} is not: a client certificate needs both its "
            "certificate and its private key (PEM files)"
        )
    if files.cert:
        cert, key = _existing("cert", files.cert), _existing("key", files.key)
        _load("cert", files.cert, lambda _: context.load_cert_chain(cert, key), "a PEM certificate matching the key")
    return context


def _existing(field: str, path: str) -> str:
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise TlsSetupError(f"{setting(field)}={path!r}: no such file; set it to the path of a PEM file")
    return str(resolved)


def _load(field: str, path: str, load: Callable[[str], None], wanted: str) -> None:
    resolved = _existing(field, path)
    try:
        load(resolved)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TlsSetupError(f"{setting(field)}={path!r} is not usable ({exc}); it must be {wanted}") from exc


def explain_refusal(exc: ssl.SSLError, where: str) -> TlsRefused:
    """A failed handshake (or the alert that ends one) as the setting that fixes it."""
    reason = (exc.reason or str(exc)).upper()
    if isinstance(exc, ssl.SSLCertVerificationError):
        what = (
            f"its certificate is not trusted ({exc.verify_message}): set {setting('ca')} to the PEM file "
            "of the CA that signed the server's certificate"
        )
    elif "CERTIFICATE_REQUIRED" in reason:
        what = f"it requires a client certificate: set {setting('cert')} and {setting('key')}"
    elif "BAD_CERTIFICATE" in reason or "UNKNOWN_CA" in reason:
        what = (
            f"it refused our client certificate ({exc.reason}): {setting('cert')} must be signed by a CA "
            "the server trusts"
        )
    else:
        what = f"TLS failed ({exc})"
    return TlsRefused(f"the NATS server at {where} refused the connection: {what}")
