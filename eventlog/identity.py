"""Who a client is on the bus: the identity part of a `NatsEndpoint` (`eventlog/endpoint.py`),
used alike by both of shoal's clients, nats-py and the `Wire` (docs/ARCHITECTURE.md §3).

Authentication is an nkey (README "Security"): the server sends a nonce in its INFO, the client
answers with its public key and the nonce signed by its seed. The seed is read from its file when
a connection signs, never kept in memory longer, and never put on a command line: a runner gets
its identity through the environment, paths only (`NatsEndpoint.child_env`).

The inbox prefix matters as much as the key: replies and push-consumer deliveries come to
`<inbox_prefix>.…`, and each identity may subscribe only under its own prefix, so no client can
read another's replies or deliveries.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import msgspec


class CredentialsUnreadable(OSError):
    """The nkey seed file cannot be read or holds no valid seed."""


class NatsIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """How one client proves who it is, and what it may do as that identity.

    - `nkey_seed_file`: path of an nkey seed file (0600); empty = connect without authentication.
    - `inbox_prefix`: where this client's replies and deliveries come; an identity's permissions
      allow subscribing only under its own prefix.
    - `manage_streams`: whether `EventLog.connect` may create or update the streams. Only the
      admin identity may (the server refuses the others), so service identities say False.
    """

    nkey_seed_file: str = ""
    inbox_prefix: str = "_INBOX"
    manage_streams: bool = True

    def nats_py_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `nats.connect` this identity stands for."""
        kwargs: dict[str, Any] = {"inbox_prefix": self.inbox_prefix}
        if self.nkey_seed_file:
            kwargs["nkeys_seed"] = self.nkey_seed_file
        return kwargs

    def connect_fields(self, nonce: str | None) -> dict[str, str]:
        """The authentication fields of a CONNECT answering an INFO that carried `nonce`."""
        if not self.nkey_seed_file or nonce is None:
            return {}
        public_key, signature = sign_nonce(Path(self.nkey_seed_file), nonce.encode())
        return {"nkey": public_key, "sig": signature}


ANONYMOUS = NatsIdentity()  # no identity: an open server (tests, a trusted network)


def sign_nonce(seed_file: Path, nonce: bytes) -> tuple[str, str]:
    """(public key, signature of `nonce`, base64url without padding) for the seed in `seed_file`."""
    import nkeys  # pyright: ignore[reportMissingTypeStubs]

    try:
        seed = bytearray(seed_file.read_bytes().strip())
        key: Any = nkeys.from_seed(seed)  # pyright: ignore[reportUnknownMemberType]
    except (OSError, ValueError, nkeys.NkeysError) as exc:  # pyright: ignore[reportUnknownMemberType]
        raise CredentialsUnreadable(f"cannot use the NATS credentials in {seed_file}: {exc}") from exc
    try:
        public_key = bytes(key.public_key).decode()
        signature = base64.urlsafe_b64encode(bytes(key.sign(nonce))).rstrip(b"=").decode()
    finally:
        key.wipe()
    return public_key, signature
