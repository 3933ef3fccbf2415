"""Join tokens: what `shoal nats token create` prints, what the control plane keeps of it, and
whether a join request that presents it is admitted (README "Security", "Adding a machine").

Pure: no I/O, the clock and the randomness come in as arguments; `services/join_desk.py` is the
shell that keeps the store on disk and answers the requests.

A token is one string a person copies to a new machine. It carries:
- `token_id`: the name `shoal nats token ls|revoke` show and take;
- `secret`: 32 random bytes; the control plane keeps only their SHA-256, so its store leaks no
  usable token;
- `join_seed`: the seed of the `join` identity, which may only ask to join (publish the join
  request and read its own replies): it lets the new machine reach the bus at all, and nothing
  more;
- `ca_sha256`: the SHA-256 of the CA certificate (DER) that signed the server's certificate, when
  the server serves TLS: the new machine fetches the CA from the server and trusts it only if it
  hashes to this (trust on first contact, pinned by what the operator handed over);
- `node`: the node id the token is for, or "" (any id not admitted yet).

Invariants of the store (each checked by `decide_join`, table-tested):
- a token admits at most one node (single use), never after it expires or is revoked;
- a refused request changes nothing (a wrong node id does not use the token up);
- a node id already admitted is never taken over by a join: revoke it first.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Literal

import msgspec

from events.ids import InvalidId, check_token

TOKEN_PREFIX = "shoaljoin1_"
SECRET_BYTES = 32
TOKEN_ID_BYTES = 6
MAX_TTL_SECONDS = 7 * 24 * 3600  # a token is handed to a person: a week is the longest it should lie around
ASK_FOR_ANOTHER = "ask the operator for a new one (`shoal nats token create` on the control host)"

TokenState = Literal["valid", "used", "expired", "revoked"]


class BadToken(ValueError):
    """A token string that is not one `shoal nats token create` printed; the message says what to do."""


class UnknownToken(KeyError):
    """No token of that id in the store."""


class JoinToken(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """What a token string carries (array-like msgpack: the string stays short enough to paste)."""

    token_id: str
    secret: bytes
    join_seed: bytes
    ca_sha256: bytes = b""
    node: str = ""


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the control plane keeps of one token: never the secret, only its hash."""

    token_id: str
    secret_sha256: str
    node: str = ""  # "" = any node id
    created: float  # unix seconds
    expires: float
    used_at: float = 0.0
    used_by: str = ""  # the node it admitted
    revoked_at: float = 0.0


class TokenStore(msgspec.Struct, frozen=True, kw_only=True):
    tokens: dict[str, TokenRecord] = msgspec.field(default_factory=dict[str, TokenRecord])


class JoinRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a joining machine sends: the token's id and secret, and only the public keys of the
    identities it made for itself (their seeds never leave it)."""

    token_id: str
    secret: bytes
    node: str
    worker_key: str
    runner_key: str


class JoinReply(msgspec.Struct, frozen=True, kw_only=True):
    admitted: bool
    message: str


class Admit(msgspec.Struct, frozen=True, kw_only=True):
    """Admit `node` with these keys; `store` is the store with the token used."""

    node: str
    worker_key: str
    runner_key: str
    store: TokenStore


class Refuse(msgspec.Struct, frozen=True, kw_only=True):
    reason: str


_encoder = msgspec.msgpack.Encoder()
_token_decoder = msgspec.msgpack.Decoder(JoinToken)


def encode_token(token: JoinToken) -> str:
    packed = _encoder.encode(token)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(packed).rstrip(b"=").decode()


def decode_token(text: str) -> JoinToken:
    """The token in `text` (surrounding blanks ignored); `BadToken` saying what to do otherwise."""
    text = text.strip()
    if not text.startswith(TOKEN_PREFIX):
        raise BadToken(
            f"that is not a shoal join token (they begin with {TOKEN_PREFIX!r}): copy the whole line "
            "`shoal nats token create` printed"
        )
    body = text.removeprefix(TOKEN_PREFIX)
    try:
        token = _token_decoder.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise BadToken(f"the join token is damaged ({exc}): copy the whole line again, or {ASK_FOR_ANOTHER}") from exc
    if len(token.secret) != SECRET_BYTES or len(token.ca_sha256) not in (0, 32) or not token.join_seed:
        raise BadToken(f"the join token is damaged (a field has the wrong length): {ASK_FOR_ANOTHER}")
    if token.node:
        try:
            check_token("node id", token.node)
        except InvalidId as exc:
            raise BadToken(f"the join token names a node id that cannot be used ({exc}): {ASK_FOR_ANOTHER}") from exc
    return token


def secret_hash(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()


def new_record(*, token_id: str, secret: bytes, node: str, now: float, ttl_seconds: float) -> TokenRecord:
    if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
        raise ValueError(f"--ttl must be more than 0 and at most {MAX_TTL_SECONDS // 3600} hours")
    return TokenRecord(
        token_id=token_id, secret_sha256=secret_hash(secret), node=node, created=now, expires=now + ttl_seconds
    )


def with_token(store: TokenStore, record: TokenRecord) -> TokenStore:
    if record.token_id in store.tokens:
        raise ValueError(f"token id {record.token_id} exists already")
    return TokenStore(tokens={**store.tokens, record.token_id: record})


def token_state(record: TokenRecord, now: float) -> TokenState:
    if record.revoked_at:
        return "revoked"
    if record.used_at:
        return "used"
    if now >= record.expires:
        return "expired"
    return "valid"


def revoke(store: TokenStore, token_id: str, now: float) -> TokenStore:
    """The store with `token_id` revoked (a used or expired one too: harmless, and says so in `ls`)."""
    record = store.tokens.get(token_id)
    if record is None:
        raise UnknownToken(token_id)
    if record.revoked_at:
        return store
    return TokenStore(tokens={**store.tokens, token_id: msgspec.structs.replace(record, revoked_at=now)})


def decide_join(store: TokenStore, request: JoinRequest, admitted_nodes: frozenset[str], now: float) -> Admit | Refuse:
    """Whether `request` is admitted, given the tokens, the nodes admitted already and the time."""
    record = store.tokens.get(request.token_id)
    # An unknown id and a wrong secret read alike: the answer tells a guesser nothing.
    if record is None or not hmac.compare_digest(record.secret_sha256, secret_hash(request.secret)):
        return Refuse(reason=f"this server knows no such join token (made for another cluster?): {ASK_FOR_ANOTHER}")
    state = token_state(record, now)
    if state == "revoked":
        return Refuse(reason=f"join token {record.token_id} was revoked: {ASK_FOR_ANOTHER}")
    if state == "used":
        return Refuse(
            reason=f"join token {record.token_id} was used already (node {record.used_by!r} joined with it); "
            f"a token admits one machine: {ASK_FOR_ANOTHER}"
        )
    if state == "expired":
        return Refuse(reason=f"join token {record.token_id} expired: {ASK_FOR_ANOTHER} (`--ttl` makes it last longer)")
    try:
        check_token("node id", request.node)
    except InvalidId as exc:
        return Refuse(reason=f"{exc}; choose another --node-id")
    if record.node and request.node != record.node:
        return Refuse(
            reason=f"join token {record.token_id} is for node {record.node!r}: run with --node-id {record.node}"
        )
    if request.node in admitted_nodes:
        return Refuse(
            reason=f"node {request.node!r} is admitted already: choose another --node-id, or on the control host "
            f"`shoal nats revoke-node {request.node}` first to replace it"
        )
    for key in (request.worker_key, request.runner_key):
        if not is_user_public_key(key):
            return Refuse(reason=f"{key!r} is not an nkey user public key: join with `shoal worker --join`")
    if request.worker_key == request.runner_key:
        return Refuse(reason="the worker and the runner need keys of their own: join with `shoal worker --join`")
    used = msgspec.structs.replace(record, used_at=now, used_by=request.node)
    return Admit(
        node=request.node,
        worker_key=request.worker_key,
        runner_key=request.runner_key,
        store=TokenStore(tokens={**store.tokens, record.token_id: used}),
    )


def is_user_public_key(key: str) -> bool:
    """An nkey user public key (`U...`: prefix byte, 32 key bytes, CRC16), as nats-server reads it."""
    import nkeys  # pyright: ignore[reportMissingTypeStubs]

    try:
        raw = base64.b32decode(key.encode() + b"=" * (-len(key) % 8))
    except (binascii.Error, ValueError):
        return False
    if len(raw) != 35:
        return False
    body, checksum = raw[:-2], int.from_bytes(raw[-2:], "little")
    crc: int = nkeys.crc16(bytearray(body))  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return body[0] == nkeys.PREFIX_BYTE_USER and crc == checksum  # pyright: ignore[reportUnknownMemberType]
