"""API keys and the browser rules, without a server: the settings, the key file, who a bearer
token makes the caller, and which requests a web page could forge."""

from __future__ import annotations

from pathlib import Path

import pytest
from loguru import logger
from starlette.datastructures import Headers

from events.ids import KeyId
from services.api.auth import OPEN_CALLER, ApiAccess, Caller, Refusal, key_id, load_api_access, parse_entries
from services.api.browser import BrowserRules, hostname
from services.cli import main
from services.config import ConfigError, resolve_config

USER = "user-key-0123456789abcdef"
OTHER = "other-key-0123456789abcdef"
ADMIN = "admin-key-0123456789abcdef"


def _access(*entries: str) -> ApiAccess:
    return ApiAccess(parse_entries(list(entries)))


def test_keys_are_comma_separated_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    resolved = resolve_config({}, env={"SHOAL_API_KEYS": f"{USER}, {ADMIN}:admin"})
    assert resolved.config.api_keys == (USER, f"{ADMIN}:admin")
    assert resolved.to_dict()["api_keys"] == {"value": "<redacted: 2 values>", "source": "env SHOAL_API_KEYS"}
    monkeypatch.setenv("SHOAL_API_KEYS", f"{USER},{ADMIN}:admin")
    assert main(["config", "show"]) == 0
    assert main(["config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    assert USER not in out and ADMIN not in out and "env SHOAL_API_KEYS" in out


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"SHOAL_API_KEYS": "too-short-key"}, "16-512 characters"),
        ({"SHOAL_API_KEYS": "a-long-enough-key-but:root"}, "may end in :admin"),
        ({"SHOAL_API_KEY": "a-long-enough-key-0123456"}, "did you mean api_keys"),
        ({"SHOAL_CORS_ORIGINS": "*"}, "no wildcard"),
    ],
)
def test_a_refused_key_is_not_repeated_in_the_error(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config({}, env=env)
    assert fragment in str(caught.value)
    if "KEY" in next(iter(env)):
        assert next(iter(env.values())) not in str(caught.value)


def test_a_bearer_token_names_its_caller_by_key_id() -> None:
    access = _access(USER, f"{ADMIN}:admin", ADMIN)  # the same key twice: one key, an admin
    assert len(access.keys) == 2
    assert access.check(f"Bearer {USER}", "key") == Caller(key_id(USER), admin=False)
    assert access.check(f"bearer  {ADMIN} ", "admin") == Caller(key_id(ADMIN), admin=True)
    assert len(key_id(USER)) == 16 and USER not in key_id(USER) and key_id(USER) != key_id(OTHER)
    assert access.check(None, "nothing") == Caller(KeyId(""), admin=False)


@pytest.mark.parametrize(
    ("authorization", "need", "status", "code", "challenge"),
    [
        (None, "key", 401, "missing_api_key", 'Bearer realm="shoal"'),
        (f"Basic {USER}", "key", 401, "missing_api_key", 'Bearer realm="shoal"'),
        ("Bearer ", "key", 401, "missing_api_key", 'Bearer realm="shoal"'),
        (f"Bearer {OTHER}", "key", 401, "invalid_api_key", 'Bearer realm="shoal", error="invalid_token"'),
        (f"Bearer {USER}", "admin", 403, "admin_key_required", 'Bearer realm="shoal", error="insufficient_scope"'),
    ],
)
def test_refusals(authorization: str | None, need: str, status: int, code: str, challenge: str) -> None:
    refused = _access(USER, f"{ADMIN}:admin").check(authorization, need)  # pyright: ignore[reportArgumentType]
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code, refused.challenge) == (status, code, challenge)
    assert USER not in refused.message and OTHER not in refused.message


def test_without_keys_the_api_is_open_and_its_caller_an_admin_but_only_on_loopback(tmp_path: Path) -> None:
    assert ApiAccess().check(None, "admin") == OPEN_CALLER
    assert OPEN_CALLER.may_see(key_id(USER)) and not Caller(key_id(OTHER), admin=False).may_see(key_id(USER))
    for host in ("127.0.0.1", "localhost", "::1"):
        assert load_api_access(resolve_config({"api_host": host}, env={}, yaml_path=None)).open
    with pytest.raises(ConfigError, match=r"api_host='0.0.0.0' \(from cli --api-host\).*needs keys"):
        load_api_access(resolve_config({"api_host": "0.0.0.0"}, env={}))
    keyed = resolve_config({"api_host": "0.0.0.0"}, env={"SHOAL_API_KEYS": USER})
    assert not load_api_access(keyed).open


def test_the_key_file_takes_comments_and_warns_when_others_can_read_it(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# the team's keys\n{USER}\n\n{ADMIN}:admin  # ops\n")
    path.chmod(0o644)
    warnings: list[str] = []
    sink = logger.add(warnings.append, level="WARNING", format="{message}")
    try:
        access = load_api_access(resolve_config({"api_keys_file": str(path)}, env={}))
    finally:
        logger.remove(sink)
    assert access.check(f"Bearer {ADMIN}", "admin") == Caller(key_id(ADMIN), admin=True)
    assert len(warnings) == 1 and "chmod 600" in warnings[0] and USER not in warnings[0]
    path.chmod(0o600)
    path.write_text(f"{USER}\nshort\n")
    with pytest.raises(ConfigError, match=r"line 2\): keys of 16-512") as caught:
        load_api_access(resolve_config({"api_keys_file": str(path)}, env={}))
    assert "short" not in str(caught.value)
    path.write_text("# nobody yet\n")
    with pytest.raises(ConfigError, match="at least one key"):
        load_api_access(resolve_config({"api_keys_file": str(path)}, env={}))
    with pytest.raises(ConfigError, match="a readable file"):
        load_api_access(resolve_config({"api_keys_file": str(tmp_path / "missing")}, env={}))


@pytest.mark.parametrize(
    ("host", "name"),
    [("127.0.0.1:8000", "127.0.0.1"), ("[::1]:8000", "::1"), ("LocalHost", "localhost"), ("::1", "::1")],
)
def test_hostname_of_a_host_header(host: str, name: str) -> None:
    assert hostname(host) == name


@pytest.mark.parametrize(
    ("bound", "method", "headers", "status"),
    [
        ("127.0.0.1", "GET", {"host": "localhost:8000"}, None),
        ("127.0.0.1", "GET", {"host": "rebound.example:8000"}, 400),
        ("127.0.0.1", "GET", {"host": "localhost.rebound.example"}, 400),
        ("0.0.0.0", "GET", {"host": "api.example"}, None),  # on a network, keys protect it: names vary
        ("127.0.0.1", "POST", {"content-type": "application/json; charset=utf-8"}, None),
        ("127.0.0.1", "POST", {"content-type": "application/x-www-form-urlencoded"}, 415),
        ("127.0.0.1", "POST", {"content-type": "text/plain", "content-length": "0"}, 415),
        ("127.0.0.1", "POST", {"content-length": "2"}, 415),
        ("127.0.0.1", "POST", {"content-length": "0"}, None),  # cancel: no body, nothing to forge
        ("127.0.0.1", "OPTIONS", {"origin": "https://page.example", "access-control-request-method": "POST"}, 403),
        ("127.0.0.1", "OPTIONS", {"origin": "https://app.example", "access-control-request-method": "POST"}, None),
    ],
)
def test_browser_rules(bound: str, method: str, headers: dict[str, str], status: int | None) -> None:
    refusal = BrowserRules(bound, ("https://app.example",)).refusal(method, Headers(headers))
    assert (refusal.status if refusal else None) == status
