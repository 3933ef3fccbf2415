"""Join tokens, pure: the string's format, and the store's decisions (single use, expiry,
revocation, a node id never taken over), table- and property-tested."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.commands.nats_token_cmd import parse_ttl
from services.credentials import new_seed, public_key
from services.join_tokens import (
    MAX_TTL_SECONDS,
    TOKEN_PREFIX,
    Admit,
    BadToken,
    JoinRequest,
    JoinToken,
    Refuse,
    TokenStore,
    UnknownToken,
    decide_join,
    decode_token,
    encode_token,
    is_user_public_key,
    new_record,
    revoke,
    token_state,
    with_token,
)

SECRET = bytes(range(32))
NOW = 1_000_000.0
TTL = 3600.0
WORKER_KEY = public_key(new_seed())
RUNNER_KEY = public_key(new_seed())

node_ids = st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)


@given(
    token_id=st.binary(min_size=6, max_size=6).map(bytes.hex),
    secret=st.binary(min_size=32, max_size=32),
    pin=st.one_of(st.just(b""), st.binary(min_size=32, max_size=32)),
    node=st.one_of(st.just(""), node_ids),
)
def test_a_token_string_round_trips(token_id: str, secret: bytes, pin: bytes, node: str) -> None:
    token = JoinToken(token_id=token_id, secret=secret, join_seed=new_seed(), ca_sha256=pin, node=node)
    text = encode_token(token)
    assert text.startswith(TOKEN_PREFIX) and text.isascii() and " " not in text
    assert len(text) < 260  # pasted by a person
    assert decode_token(f"  {text}\n") == token


def _token() -> JoinToken:
    return JoinToken(token_id="abcdef012345", secret=SECRET, join_seed=new_seed())


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("hello", "not a shoal join token"),
        (TOKEN_PREFIX + "!!!!", "damaged"),
        (encode_token(_token())[:-20], "damaged"),
        (encode_token(JoinToken(token_id="x", secret=b"short", join_seed=b"S")), "wrong length"),
        (encode_token(JoinToken(token_id="x", secret=SECRET, join_seed=b"S", ca_sha256=b"12")), "wrong length"),
        (encode_token(JoinToken(token_id="x", secret=SECRET, join_seed=b"S", node="a.b")), "node id"),
    ],
)
def test_a_damaged_token_is_refused_saying_what_to_do(text: str, says: str) -> None:
    with pytest.raises(BadToken, match=says):
        decode_token(text)


def _store(node: str = "", *, used_at: float = 0.0, used_by: str = "", revoked_at: float = 0.0) -> TokenStore:
    record = new_record(token_id="t1", secret=SECRET, node=node, now=NOW, ttl_seconds=TTL)
    changed = msgspec.structs.replace(record, used_at=used_at, used_by=used_by, revoked_at=revoked_at)
    return with_token(TokenStore(), changed)


def _request(node: str = "node-z", *, token_id: str = "t1", secret: bytes = SECRET, **keys: str) -> JoinRequest:
    return JoinRequest(
        token_id=token_id,
        secret=secret,
        node=node,
        worker_key=keys.get("worker_key", WORKER_KEY),
        runner_key=keys.get("runner_key", RUNNER_KEY),
    )


@pytest.mark.parametrize(
    ("store", "request_", "admitted", "now", "says"),
    [
        (_store(), _request(), frozenset[str](), NOW, None),
        (_store(), _request(), frozenset[str](), NOW + TTL - 1, None),
        (_store(), _request(), frozenset[str](), NOW + TTL, "expired"),
        (_store(used_at=NOW, used_by="node-y"), _request(), frozenset[str](), NOW, "used already \\(node 'node-y'"),
        (_store(revoked_at=NOW), _request(), frozenset[str](), NOW, "revoked"),
        (_store(), _request(token_id="t2"), frozenset[str](), NOW, "knows no such join token"),
        (_store(), _request(secret=bytes(32)), frozenset[str](), NOW, "knows no such join token"),
        (_store(node="node-a"), _request("node-b"), frozenset[str](), NOW, "is for node 'node-a'.*--node-id node-a"),
        (_store(node="node-a"), _request("node-a"), frozenset[str](), NOW, None),
        (_store(), _request("node-0"), frozenset({"node-0"}), NOW, "admitted already.*revoke-node node-0"),
        (_store(), _request("a.b"), frozenset[str](), NOW, "node id"),
        (_store(), _request(worker_key="not-a-key"), frozenset[str](), NOW, "not an nkey user public key"),
        (_store(), _request(runner_key=WORKER_KEY), frozenset[str](), NOW, "keys of their own"),
    ],
)
def test_each_join_decision(
    store: TokenStore, request_: JoinRequest, admitted: frozenset[str], now: float, says: str | None
) -> None:
    decision = decide_join(store, request_, admitted, now)
    if says is None:
        assert isinstance(decision, Admit)
        assert (decision.node, decision.worker_key, decision.runner_key) == (request_.node, WORKER_KEY, RUNNER_KEY)
        used = decision.store.tokens["t1"]
        assert token_state(used, now) == "used" and used.used_by == request_.node
    else:
        assert isinstance(decision, Refuse)
        assert re.search(says, decision.reason), decision.reason
        if "no such" not in says:
            assert "shoal nats" in decision.reason or "--node-id" in decision.reason or "join" in decision.reason


def test_the_store_keeps_no_secret() -> None:
    record = new_record(token_id="t1", secret=SECRET, node="", now=NOW, ttl_seconds=TTL)
    assert SECRET.hex() not in repr(record) and SECRET not in repr(record).encode()


@pytest.mark.parametrize("ttl", [0.0, -1.0, MAX_TTL_SECONDS + 1.0])
def test_a_ttl_out_of_bounds_is_refused(ttl: float) -> None:
    with pytest.raises(ValueError, match="--ttl"):
        new_record(token_id="t1", secret=SECRET, node="", now=NOW, ttl_seconds=ttl)


def test_revoking_an_unknown_token_is_named_and_twice_is_harmless() -> None:
    with pytest.raises(UnknownToken):
        revoke(TokenStore(), "nope", NOW)
    once = revoke(_store(), "t1", NOW)
    assert revoke(once, "t1", NOW + 5) == once


# An operation on the store: a join attempt (node, time) or a revocation (time).
operations = st.lists(
    st.one_of(
        st.tuples(st.just("join"), node_ids, st.floats(min_value=NOW - 10, max_value=NOW + 2 * TTL)),
        st.tuples(st.just("revoke"), st.just(""), st.floats(min_value=NOW - 10, max_value=NOW + 2 * TTL)),
    ),
    max_size=12,
)


@settings(max_examples=200)
@given(ops=operations)
def test_a_token_admits_at_most_one_node_and_never_after_it_expires_or_is_revoked(
    ops: list[tuple[str, str, float]],
) -> None:
    store = _store()
    admitted: set[str] = set()
    revoked_at: float | None = None
    for kind, node, at in ops:
        if kind == "revoke":
            store = revoke(store, "t1", at)
            revoked_at = revoked_at if revoked_at is not None else at
            continue
        decision = decide_join(store, _request(node), frozenset(admitted), at)
        if isinstance(decision, Admit):
            assert not admitted, "a second node joined with one token"
            assert at < NOW + TTL and revoked_at is None
            admitted.add(decision.node)
            store = decision.store
    assert len(admitted) <= 1


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90.0), ("30m", 1800.0), ("1h", 3600.0), ("2d", 172800.0), ("1.5h", 5400.0)]
)
def test_ttls_are_read(text: str, seconds: float) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["1", "h", "1w", "-1h", ""])
def test_a_ttl_without_a_unit_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 30m"):
        parse_ttl(text)


def test_only_user_public_keys_are_keys() -> None:
    assert is_user_public_key(WORKER_KEY)
    assert not is_user_public_key(new_seed().decode())  # a seed is never sent
    assert not is_user_public_key(WORKER_KEY[:-1] + ("A" if WORKER_KEY[-1] != "A" else "B"))
    assert not is_user_public_key("U" + "A" * 55)
