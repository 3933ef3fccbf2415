"""Where and how shoal connects to NATS: one small value every connection is opened from.

    endpoint = NatsEndpoint(url="tls://h:4222", tls=TlsFiles(ca="ca.pem"), identity=NatsIdentity(...))
    log = await EventLog.connect(endpoint)

`services.credentials.endpoint_for(config, identity)` builds it for a role from the settings
(`ShoalConfig.nats_endpoint`: URL and TLS files; the identity's seed file and inbox);
`EventLog.connect` takes it (or a bare URL: plain, anonymous); a worker hands its runners theirs as
the URL on their command line plus environment variables (`child_env` / `from_env`) that hold file
paths only, so nothing secret ever goes on a command line or into an environment.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import msgspec

from eventlog.identity import ANONYMOUS, NatsIdentity
from eventlog.tls import SETTING_PREFIX, TlsFiles, client_context

IDENTITY_ENV = "SHOAL_NATS_IDENTITY"  # a runner's NatsIdentity as JSON (paths only), set by its worker


def _tls_env_name(field: str) -> str:
    return f"SHOAL_{SETTING_PREFIX}{field}".upper()


class NatsEndpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A NATS URL (comma-separated for a cluster), the TLS files and the identity to connect with."""

    url: str
    tls: TlsFiles = TlsFiles()
    identity: NatsIdentity = ANONYMOUS

    @property
    def wants_tls(self) -> bool:
        """A `tls://` URL or any TLS file turns TLS on; a server that requires TLS gets it anyway."""
        return "tls://" in self.url or self.tls.any

    def tls_context(self) -> ssl.SSLContext | None:
        """The client context when TLS is wanted (a `TlsSetupError` names a bad file), else None."""
        return client_context(self.tls) if self.wants_tls else None

    def nats_py_kwargs(self, tls: ssl.SSLContext | None) -> dict[str, Any]:
        """The keyword arguments of `nats.connect` for this endpoint, with `tls` (from `tls_context`)."""
        return {**self.identity.nats_py_kwargs(), **({"tls": tls} if tls is not None else {})}

    def child_env(self) -> dict[str, str]:
        """The variables a child process reads back with `from_env` (every one set: "" = none)."""
        tls = {_tls_env_name(field): getattr(self.tls, field) for field in TlsFiles.__struct_fields__}
        return {**tls, IDENTITY_ENV: msgspec.json.encode(self.identity).decode()}

    @classmethod
    def from_env(cls, url: str, env: Mapping[str, str]) -> NatsEndpoint:
        files = {field: env.get(_tls_env_name(field), "") for field in TlsFiles.__struct_fields__}
        identity_json = env.get(IDENTITY_ENV, "")
        identity = msgspec.json.decode(identity_json, type=NatsIdentity) if identity_json else ANONYMOUS
        return cls(url=url, tls=TlsFiles(**files), identity=identity)
