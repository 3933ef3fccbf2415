"""A new machine's side of joining with a token: `shoal worker --join URL --token T`
(README "Adding a machine"; the control plane's side is `services/join_desk.py`).

1. The node's worker and runner seeds are made here, fresh for each join (a node revoked for a
   stolen seed never reuses it), and never leave it: only their public keys are sent; they are
   written (0600, in this host's identity directory) once the node is admitted.
2. When the token pins a CA (the server serves TLS), the CA certificate is fetched from the
   server over a connection that does not verify it yet, and kept only if its SHA-256 is the
   token's pin; every later connection verifies the server against it. A certificate that does
   not match is refused (`JoinRefused`): someone else answered, or the token is for another
   server. Nothing secret travels on the unverified connection: the join identity's signature of
   the server's nonce, which admits to nothing but asking.
3. The request (token id and secret, node id, public keys) goes over a verified connection; the
   control plane admits the keys and reloads the server before it answers.
4. `joined.json` records the URL, node and CA, so a restarted worker (`shoal worker --join URL`
   again, the token no longer needed) runs with what it has.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncGenerator
from pathlib import Path

import msgspec
import nats
import nats.errors
from nats.aio.client import Client

from eventlog.identity import NatsIdentity
from eventlog.tls import TlsFiles, TlsSetupError, client_context
from services.credentials import (
    JOIN_IDENTITY,
    new_seed,
    private_dir,
    public_key,
    seed_path,
    write_secret,
)
from services.join_desk import certificate_sha256
from services.join_tokens import JoinReply, JoinRequest, JoinToken
from services.nats_permissions import JOIN_CA_SUBJECT, JOIN_REQUEST_SUBJECT, node_identities

JOINED_FILE = "joined.json"
PINNED_CA = "ca.pem"
REQUEST_SECONDS = 30.0  # the control plane reloads the server before it answers


class JoinRefused(Exception):
    """The join did not happen; the message says why and what to do."""


class Joined(msgspec.Struct, frozen=True, kw_only=True):
    """What this machine joined as: enough to run its worker again without the token."""

    url: str
    node: str
    token_id: str  # the token it joined with (the same command run again does not join again)
    ca: str = ""  # the pinned CA's file, "" without TLS


def read_joined(directory: Path) -> Joined | None:
    path = directory / JOINED_FILE
    return msgspec.json.decode(path.read_bytes(), type=Joined) if path.is_file() else None


def tls_with_ca(tls: TlsFiles, ca: str) -> TlsFiles:
    return msgspec.structs.replace(tls, ca=ca) if ca else tls


async def join(url: str, token: JoinToken, node: str, directory: Path, tls: TlsFiles) -> Joined:
    """Join the cluster at `url` as `node` with `token`; this host's identities go to `directory`.
    `tls`: this host's TLS settings (a client certificate, for a server that requires one)."""
    private_dir(directory)
    join_seed = seed_path(directory, JOIN_IDENTITY)
    write_secret(join_seed, token.join_seed + b"\n")
    try:
        ca = ""
        if token.ca_sha256:
            ca = str(await _pin_ca(url, token, join_seed, tls, directory))
        # New seeds, kept in memory until the node is admitted: a refused join leaves the seeds
        # this host may already serve with as they were.
        worker_seed, runner_seed = new_seed(), new_seed()
        request = JoinRequest(
            token_id=token.token_id,
            secret=token.secret,
            node=node,
            worker_key=public_key(worker_seed),
            runner_key=public_key(runner_seed),
        )
        async with _connected(url, join_seed, _verifying(tls_with_ca(tls, ca))) as nc:
            try:
                answer = await nc.request(  # pyright: ignore[reportUnknownMemberType]
                    JOIN_REQUEST_SUBJECT, msgspec.json.encode(request), timeout=REQUEST_SECONDS
                )
            except nats.errors.NoRespondersError as exc:
                raise JoinRefused(
                    f"nothing answers join requests at {url}: is it the server `shoal nats` or `shoal up` runs, "
                    "from a version that takes join tokens?"
                ) from exc
            except nats.errors.TimeoutError as exc:
                raise JoinRefused(f"the control plane at {url} did not answer within {REQUEST_SECONDS:.0f}s") from exc
        reply = msgspec.json.decode(answer.data, type=JoinReply)
        if not reply.admitted:
            raise JoinRefused(f"the control plane refused to admit node {node!r}: {reply.message}")
        for identity, seed in zip(node_identities(node), (worker_seed, runner_seed), strict=True):
            write_secret(seed_path(directory, identity), seed + b"\n")
        joined = Joined(url=url, node=node, token_id=token.token_id, ca=ca)
        write_secret(directory / JOINED_FILE, msgspec.json.encode(joined) + b"\n")
        return joined
    finally:
        join_seed.unlink(missing_ok=True)  # the token's, not this node's: no use once joined


async def _pin_ca(url: str, token: JoinToken, join_seed: Path, tls: TlsFiles, directory: Path) -> Path:
    """The server's CA, fetched unverified and kept only if it hashes to the token's pin."""
    async with _connected(url, join_seed, _unverified(tls)) as nc:
        try:
            answer = await nc.request(JOIN_CA_SUBJECT, b"", timeout=REQUEST_SECONDS)  # pyright: ignore[reportUnknownMemberType]
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            raise JoinRefused(f"the server at {url} did not hand out its CA certificate ({exc!r})") from exc
    pem = bytes(answer.data).decode(errors="replace")
    try:
        got = certificate_sha256(pem)
    except ValueError as exc:
        raise JoinRefused(
            f"the server at {url} serves no CA certificate, yet the token pins one: is the URL the token's server?"
        ) from exc
    if got != token.ca_sha256:
        raise JoinRefused(
            f"the server at {url} presented a CA whose SHA-256 is {got.hex()}, not the token's "
            f"{token.ca_sha256.hex()}: another server answered (check the URL and the network), or the "
            "token is for another cluster. Nothing was sent; ask the operator for a token of this server"
        )
    path = directory / PINNED_CA
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    first = pem[pem.find(begin) : pem.find(end) + len(end)]  # only the certificate that was pinned
    path.write_text(first + "\n")
    return path


def _verifying(tls: TlsFiles) -> ssl.SSLContext | None:
    if not tls.any:
        return None
    try:
        return client_context(tls)
    except TlsSetupError as exc:
        raise JoinRefused(str(exc)) from exc


def _unverified(tls: TlsFiles) -> ssl.SSLContext:
    """TLS that accepts any server certificate (only to fetch the CA, checked against the pin),
    presenting this host's client certificate when it has one."""
    context = _verifying(msgspec.structs.replace(tls, ca="")) or ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@contextlib.asynccontextmanager
async def _connected(url: str, join_seed: Path, tls: ssl.SSLContext | None) -> AsyncGenerator[Client]:
    identity = NatsIdentity(
        nkey_seed_file=str(join_seed), inbox_prefix=JOIN_IDENTITY.inbox_prefix, manage_streams=False
    )
    try:
        nc = await nats.connect(  # pyright: ignore[reportUnknownMemberType]
            url,
            name="shoal-join",
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=5,
            **identity.nats_py_kwargs(),
            **({"tls": tls} if tls is not None else {}),
        )
    except ssl.SSLCertVerificationError as exc:
        raise JoinRefused(f"the server at {url} is not the one the token pins ({exc.verify_message})") from exc
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        raise JoinRefused(
            f"cannot reach the NATS server at {url} as the token's join identity ({exc!r}): check the URL "
            "(the control host's address and port, `tls://` when it serves TLS) and that the token is of that server"
        ) from exc
    try:
        yield nc
    finally:
        await nc.close()
