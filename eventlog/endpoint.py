"""Where and how shoal connects to NATS: one small value every connection is opened from.

`services.config.ShoalConfig.nats_endpoint` builds it from the settings; `EventLog.connect` takes
it (or a bare URL: plain, no files); a worker hands it to its runners as the URL on their command
line plus environment variables named like the settings (`child_env` / `from_env`), so no file a
connection needs, and nothing secret, ever goes on a command line.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import msgspec

from eventlog.tls import SETTING_PREFIX, TlsFiles, client_context


def _env_name(field: str) -> str:
    return f"SHOAL_{SETTING_PREFIX}{field}".upper()


class NatsEndpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A NATS URL (comma-separated for a cluster) and the TLS files to connect with."""

    url: str
    tls: TlsFiles = TlsFiles()

    @property
    def wants_tls(self) -> bool:
        """A `tls://` URL or any TLS file turns TLS on; a server that requires TLS gets it anyway."""
        return "tls://" in self.url or self.tls.any

    def tls_context(self) -> ssl.SSLContext | None:
        """The client context when TLS is wanted (a `TlsSetupError` names a bad file), else None."""
        return client_context(self.tls) if self.wants_tls else None

    def child_env(self) -> dict[str, str]:
        """The variables a child process reads back with `from_env` (every one set: "" = none)."""
        return {_env_name(field): getattr(self.tls, field) for field in TlsFiles.__struct_fields__}

    @classmethod
    def from_env(cls, url: str, env: Mapping[str, str]) -> NatsEndpoint:
        files = {field: env.get(_env_name(field), "") for field in TlsFiles.__struct_fields__}
        return cls(url=url, tls=TlsFiles(**files))
