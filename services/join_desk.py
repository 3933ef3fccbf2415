"""The control plane's side of joining with a token (README "Adding a machine"): the token store
on disk, `shoal nats token create|ls|revoke`, `shoal nats revoke-node`, and the desk that answers
join requests while the embedded server runs (`shoal nats`, `shoal up`).

The decisions are `services/join_tokens.py`'s; this file does the I/O around them. Everything a
join or a revocation changes lives in the server's identity directory (`services/credentials.py`),
under its lock: the token store `join-tokens.json` (0600, secrets hashed), and the registry of
admitted identities with the server configs rendered from it. A change of who is admitted is
written, then the running server is told to reload (`services/nats_reload.py`: no restart, no
client of another identity dropped), and only then answered.

The desk listens as the admin identity on two subjects only the `join` identity may publish:
- `shoal.join.ca`: the CA certificate (PEM) that signed the server's certificate, or empty without
  TLS. Nothing secret: the joining machine trusts it only if it hashes to the token's pin;
- `shoal.join.request`: a `JoinRequest`; the answer is a `JoinReply`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import ssl
from collections.abc import Callable
from pathlib import Path

import msgspec
from loguru import logger
from nats.aio.subscription import Subscription

from eventlog.client import NatsClient
from eventlog.endpoint import NatsEndpoint
from services.credentials import (
    JOIN_IDENTITY,
    CredentialsError,
    admit_node,
    admitted_nodes,
    directory_lock,
    read_registry,
    remove_node,
    restore_registry,
    seed_path,
    write_secret,
)
from services.join_tokens import (
    SECRET_BYTES,
    TOKEN_ID_BYTES,
    Admit,
    JoinReply,
    JoinRequest,
    JoinToken,
    Refuse,
    TokenRecord,
    TokenStore,
    decide_join,
    new_record,
    revoke,
    with_token,
)
from services.nats_errors import NatsError
from services.nats_permissions import JOIN_CA_SUBJECT, JOIN_REQUEST_SUBJECT
from services.nats_reload import NatsReloadFailed, reload_server

TOKENS_FILE = "join-tokens.json"

_request_decoder = msgspec.json.Decoder(JoinRequest)


def read_tokens(directory: Path) -> TokenStore:
    path = directory / TOKENS_FILE
    return msgspec.json.decode(path.read_bytes(), type=TokenStore) if path.exists() else TokenStore()


def _write_tokens(directory: Path, store: TokenStore) -> None:
    write_secret(directory / TOKENS_FILE, msgspec.json.format(msgspec.json.encode(store)) + b"\n")


def ca_fingerprint(ca_file: str) -> bytes:
    """The SHA-256 of the first certificate (DER) in the PEM file `ca_file`: the token's pin."""
    return certificate_sha256(Path(ca_file).expanduser().read_text())


def certificate_sha256(pem: str) -> bytes:
    """SHA-256 of the DER of the first PEM certificate in `pem`; ValueError if there is none."""
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError("no PEM certificate in it")
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem[start : stop + len(end)])).digest()


def create_token(
    directory: Path,
    *,
    node: str,
    ttl_seconds: float,
    ca_sha256: bytes,
    now: float,
    random_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> tuple[JoinToken, TokenRecord]:
    """A new token, recorded (hashed) in `directory`'s store; the token to print and its record."""
    join_seed = seed_path(directory, JOIN_IDENTITY)
    if not join_seed.is_file():
        raise CredentialsError(
            f"no join identity in {directory}: start the server once with this version (`shoal nats` or "
            "`shoal up` on this host makes it), then create the token"
        )
    with directory_lock(directory):
        store = read_tokens(directory)
        token_id = random_bytes(TOKEN_ID_BYTES).hex()
        secret = random_bytes(SECRET_BYTES)
        record = new_record(token_id=token_id, secret=secret, node=node, now=now, ttl_seconds=ttl_seconds)
        _write_tokens(directory, with_token(store, record))
    token = JoinToken(
        token_id=token_id, secret=secret, join_seed=join_seed.read_bytes().strip(), ca_sha256=ca_sha256, node=node
    )
    return token, record


def revoke_token(directory: Path, token_id: str, now: float) -> None:
    """`UnknownToken` if the store has no such token."""
    with directory_lock(directory):
        _write_tokens(directory, revoke(read_tokens(directory), token_id, now))


def revoke_node(directory: Path, store_dir: Path, node: str) -> tuple[list[str], bool]:
    """Stop admitting `node` (its identities leave the registry, its seeds kept here are deleted)
    and have the running server drop its connections: the identities removed, and whether a
    running server reloaded (False: none runs; the next start admits it no more)."""
    with directory_lock(directory):
        removed = remove_node(directory, node)
        reloaded = reload_server(store_dir) if removed else False
    return removed, reloaded


def answer_join(directory: Path, store_dir: Path, request: JoinRequest, now: float) -> JoinReply:
    """Decide `request`, and for an admitted node write its public keys and reload the server
    before the token is marked used: a server that refuses the new config leaves the token valid
    and the registry as it was."""
    with directory_lock(directory):
        decision = decide_join(read_tokens(directory), request, admitted_nodes(read_registry(directory)), now)
        match decision:
            case Refuse(reason=reason):
                return JoinReply(admitted=False, message=reason)
            case Admit(node=node, worker_key=worker_key, runner_key=runner_key, store=used):
                before = admit_node(directory, node, worker_key, runner_key)
                try:
                    reload_server(store_dir)
                except NatsReloadFailed as exc:
                    restore_registry(directory, before)
                    with contextlib.suppress(NatsReloadFailed):  # it kept the old config: the one restored
                        reload_server(store_dir)
                    return JoinReply(admitted=False, message=f"the server could not admit the node: {exc}")
                _write_tokens(directory, used)
                return JoinReply(admitted=True, message=f"node {node!r} admitted (token {request.token_id})")


class JoinDesk:
    """Answers join requests on the bus for the server whose identities live in `directory` and
    whose JetStream store is `store_dir`; `ca_file` is the CA a TLS server's certificate is signed
    by ("" without TLS)."""

    def __init__(self, *, directory: Path, store_dir: Path, ca_file: str, clock: Callable[[], float]) -> None:
        self._directory = directory
        self._store_dir = store_dir
        self._ca_pem = Path(ca_file).expanduser().read_bytes() if ca_file else b""
        self._clock = clock

    async def serve(self, admin: NatsEndpoint, ready: asyncio.Event | None = None) -> None:
        """Answer until cancelled, connected as the admin (`admin`)."""
        client = await NatsClient.open(admin, name="shoal-join-desk", wait_seconds=10)
        try:
            requests = await client.nc.subscribe(JOIN_REQUEST_SUBJECT)  # pyright: ignore[reportUnknownMemberType]
            cas = await client.nc.subscribe(JOIN_CA_SUBJECT)  # pyright: ignore[reportUnknownMemberType]
            await client.nc.flush()
            if ready is not None:
                ready.set()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._answer_cas(cas))
                group.create_task(self._answer_requests(requests))
        finally:
            await client.close()

    async def _answer_cas(self, subscription: Subscription) -> None:
        async for message in subscription.messages:
            await message.respond(self._ca_pem)

    async def _answer_requests(self, subscription: Subscription) -> None:
        async for message in subscription.messages:  # one at a time: each holds the directory's lock anyway
            reply = await asyncio.to_thread(self.answer, message.data)
            await message.respond(msgspec.json.encode(reply))

    def answer(self, data: bytes) -> JoinReply:
        """The reply to one request; a request that cannot be answered fails alone, never the desk."""
        try:
            request = _request_decoder.decode(data)
        except msgspec.DecodeError as exc:
            return JoinReply(admitted=False, message=f"not a join request ({exc}): join with `shoal worker --join`")
        try:
            reply = answer_join(self._directory, self._store_dir, request, self._clock())
        except (OSError, ValueError, NatsError) as exc:  # a file unreadable or full, a server gone
            logger.error("join request for node {!r} could not be answered: {!r}", request.node, exc)
            return JoinReply(admitted=False, message=f"the control plane could not admit the node ({exc}); try again")
        logger.info("join request for node {!r} (token {}): {}", request.node, request.token_id, reply.message)
        return reply
