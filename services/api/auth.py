"""API keys: who is calling, and whether they may call this route.

Keys come from `api_keys` (SHOAL_API_KEYS) and `api_keys_file`, in one syntax for both: `KEY`, or
`KEY:admin` for an admin key. A suffix rather than a second setting, so an admin key can live
in the 0600 file next to the others (an env var or shoal.yaml is easier to leak), and a bearer
token can never contain ":", so the suffix is unambiguous.

Invariants:
- keys are kept only as SHA-256 digests, and a presented key is compared with every one of them
  by `hmac.compare_digest`: neither which key matched nor how much of it did shows in the timing;
- a caller is named by `key_id` (16 hex digits of the digest), never by its key: that is what
  goes on the log as a task's owner, so every API replica and every restart agrees on ownership;
- with no keys configured the API is open, which `load_api_access` allows on a loopback bind
  only; an open caller is an admin (on one's own machine, one is the operator).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loguru import logger
from starlette.requests import Request
from starlette.responses import Response

from events.ids import KeyId
from services.api.errors import error_response
from services.api.schemas import RequestProblem
from services.config import FIELDS, ConfigError, ResolvedConfig

Need = Literal["nothing", "key", "admin"]  # what a route asks of its caller
ADMIN_SUFFIX = ":admin"
_CALLER = "shoal.caller"  # the request scope's key for the checked caller
_REALM = 'Bearer realm="shoal"'


@dataclass(frozen=True)
class Caller:
    key_id: KeyId  # "" for a caller without a key (an open API, or an open route)
    admin: bool

    def may_see(self, owner: KeyId) -> bool:
        """A task is its creator's, and every admin's; to anyone else it does not exist."""
        return self.admin or owner == self.key_id


OPEN_CALLER = Caller(KeyId(""), admin=True)
ANONYMOUS = Caller(KeyId(""), admin=False)


@dataclass(frozen=True)
class Refusal:
    """A request turned away before its route ran, as an OpenAI-shaped JSON error."""

    status: int
    message: str
    code: str
    challenge: str | None = None  # the WWW-Authenticate header of a 401/403

    def response(self) -> Response:
        headers = {"WWW-Authenticate": self.challenge} if self.challenge else None
        return error_response(self.status, self.message, code=self.code, headers=headers)

    def problem(self) -> RequestProblem:
        """The refusal as a route's problem, for a route that answers in another API's shape."""
        headers = {"WWW-Authenticate": self.challenge} if self.challenge else None
        return RequestProblem(self.status, self.message, code=self.code, headers=headers)


@dataclass(frozen=True)
class KeyEntry:
    digest: bytes
    admin: bool

    @property
    def key_id(self) -> KeyId:
        return KeyId(self.digest.hex()[:16])


@dataclass(frozen=True)
class ApiAccess:
    """The keys the API accepts; none = an open API."""

    keys: tuple[KeyEntry, ...] = ()

    @property
    def open(self) -> bool:
        return not self.keys

    def describe(self) -> str:
        """For the ready line: whether the API is open, which a user must be told."""
        if self.open:
            return "API open: no API keys configured (loopback only)"
        admins = sum(entry.admin for entry in self.keys)
        return f"API keys required ({len(self.keys)} keys, {admins} admin)"

    def check(self, authorization: str | None, need: Need) -> Caller | Refusal:
        """The caller a route with this `need` serves, or why it refuses them."""
        if need == "nothing":
            return ANONYMOUS
        if self.open:
            return OPEN_CALLER
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            message = (
                "this API needs a key: send `Authorization: Bearer <key>` (the OpenAI clients' api_key) "
                "or `x-api-key: <key>` (the Anthropic clients')"
            )
            return Refusal(401, message, "missing_api_key", _REALM)
        caller = self._identify(token.strip())
        if caller is None:
            return Refusal(401, "the API key is not valid", "invalid_api_key", f'{_REALM}, error="invalid_token"')
        if need == "admin" and not caller.admin:
            message = f"this route needs an admin key (an API key configured as KEY{ADMIN_SUFFIX})"
            return Refusal(403, message, "admin_key_required", f'{_REALM}, error="insufficient_scope"')
        return caller

    def _identify(self, token: str) -> Caller | None:
        presented = _digest(token)
        found: KeyEntry | None = None
        for entry in self.keys:  # no early exit: every presented key costs the same
            if hmac.compare_digest(entry.digest, presented):
                found = entry
        return Caller(found.key_id, found.admin) if found is not None else None


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The request's credentials as an `Authorization` value: that header, or else Anthropic's
    `x-api-key` (the Anthropic clients send their key there), as a bearer token."""
    authorization = headers.get("authorization")
    if authorization is not None:
        return authorization
    api_key = headers.get("x-api-key")
    return None if api_key is None else f"Bearer {api_key}"


def key_id(key: str) -> KeyId:
    """The id a key is known by on the log (`TaskCreated.owner`)."""
    return KeyEntry(_digest(key), admin=False).key_id


def parse_entries(entries: list[str]) -> tuple[KeyEntry, ...]:
    """`KEY` / `KEY:admin` entries (already checked against the setting's pattern) as key entries;
    a key given twice is one key, an admin if either says so."""
    admin_by_digest: dict[bytes, bool] = {}
    for entry in entries:
        key, admin = (entry[: -len(ADMIN_SUFFIX)], True) if entry.endswith(ADMIN_SUFFIX) else (entry, False)
        digest = _digest(key)
        admin_by_digest[digest] = admin_by_digest.get(digest, False) or admin
    return tuple(KeyEntry(digest, admin) for digest, admin in admin_by_digest.items())


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


# --- the shell: settings and the key file --------------------------------------------------


def load_api_access(resolved: ResolvedConfig) -> ApiAccess:
    """The API's keys from the config and the key file; refuses an open API on a network."""
    config, sources = resolved.config, resolved.sources
    entries = list(config.api_keys)
    if config.api_keys_file:
        entries += read_keys_file(Path(config.api_keys_file).expanduser(), sources.get("api_keys_file", "default"))
    access = ApiAccess(parse_entries(entries))
    if access.open and not is_loopback(config.api_host):
        raise ConfigError(
            "api_host",
            config.api_host,
            sources.get("api_host", "default"),
            "a loopback address (127.0.0.1, ::1 or localhost) while no API key is configured: an API on a "
            "network needs keys (set api_keys / SHOAL_API_KEYS, or api_keys_file)",
        )
    return access


def read_keys_file(path: Path, source: str) -> list[str]:
    """The entries of a key file: one a line, `#` starts a comment; at least one is required, since
    a key file that turned out empty would otherwise leave the API open without saying so."""
    try:
        text = path.read_text()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise ConfigError("api_keys_file", str(path), source, f"a readable file ({exc.strerror})") from None
    if mode & 0o077:
        logger.warning("api_keys_file {} can be read by other users (mode {:o}): run `chmod 600 {}`", path, mode, path)
    entries: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.partition("#")[0].strip()
        if entry:
            FIELDS.checked("api_keys", [entry], f"{path} line {number}")
            entries.append(entry)
    if not entries:
        raise ConfigError("api_keys_file", str(path), source, "a file with at least one key (found none)")
    return entries


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- the caller of a request ---------------------------------------------------------------


def admit(request: Request, caller: Caller) -> None:
    """Record the checked caller on the request, for the route to read with `caller_of`."""
    request.scope[_CALLER] = caller


def caller_in(scope: Mapping[str, object]) -> Caller | None:
    """The checked caller of a request's scope, None before (or without) the check."""
    caller = scope.get(_CALLER)
    return caller if isinstance(caller, Caller) else None


def caller_of(request: Request) -> Caller:
    caller = request.scope.get(_CALLER)
    if not isinstance(caller, Caller):
        raise LookupError(f"{request.url.path} was routed without an access check")
    return caller
