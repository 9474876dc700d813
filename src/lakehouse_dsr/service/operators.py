"""Named operators: who may use the operator API, and the name under which the audit records it.

Three kinds of credential, each naming its operator:

- tokens in the operators file (`intake.operators_file`; default `dsr-operators.json` beside the key
  file), each with a name and an optional expiry. The file holds the SHA-256 of each token, never the
  token: a token is 256 random bits, so a fast hash is as safe as a slow one and costs no time per
  call. `dsr operator add | list | revoke` change one entry each; a running server reads the file
  again when it changes, so adding or revoking one operator needs no restart and touches no other.
- `$DSR_API_TOKEN`, the one shared token of earlier versions: the operator `default`.
- JWTs (`intake.jwt`), verified with PyJWT against a JWKS file or URL: the operator `jwt:<claim>`
  (the prefix keeps a token's subject from passing for a named token's operator in the audit).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import jwt

from ..config import JwtSettings, Settings
from ..exceptions import DsrError, first_line

log = logging.getLogger("lakehouse_dsr.service")
SHARED = "default"  # the name of $DSR_API_TOKEN's operator
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FORMAT = 1


class OperatorError(DsrError):
    """An operator that cannot be added or revoked (the message names the operator, never a token)."""


@dataclass(frozen=True)
class OperatorRecord:
    """One named token as the operators file keeps it."""

    name: str
    token_sha256: str
    created: datetime
    expires: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and now >= self.expires


def operators_file(settings: Settings) -> Path:
    return settings.intake.operators_file or settings.key_file().parent / "dsr-operators.json"


def expiry(value: str) -> datetime:
    """`--expires`: a date (the token works through that day, UTC) or an ISO-8601 time (UTC unless it
    says otherwise)."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return datetime.combine(date.fromisoformat(value) + timedelta(days=1), time(), UTC)
        given = datetime.fromisoformat(value)
    except ValueError:
        raise OperatorError(f"{value!r} is neither a date (YYYY-MM-DD) nor an ISO-8601 time") from None
    return given if given.tzinfo else given.replace(tzinfo=UTC)


def add_operator(path: Path, name: str, expires: datetime | None = None, now: datetime | None = None) -> str:
    """Add a named operator and return its token (shown once: only its hash is kept). Refused: a name
    that is taken or not plain, `default` (the shared $DSR_API_TOKEN), an expiry already past.
    Cost: one read and one atomic rewrite of the operators file, under its lock."""
    now = now or datetime.now(UTC)
    if not NAME.fullmatch(name):
        raise OperatorError("an operator's name is 1 to 64 letters, digits, '.', '_' or '-' (first a letter or "
                            "digit)")
    if name == SHARED:
        raise OperatorError(f"{SHARED!r} is the operator of $DSR_API_TOKEN; choose another name")
    if expires is not None and expires <= now:
        raise OperatorError(f"the expiry {expires.isoformat()} is already past")
    token = secrets.token_urlsafe(32)
    with _locked(path) as records:
        if name in records:
            raise OperatorError(f"operator {name!r} exists; revoke it first to issue a new token")
        records[name] = OperatorRecord(name, _digest(token), now.replace(microsecond=0), expires)
    return token


def revoke_operator(path: Path, name: str) -> None:
    """Remove one operator: its token stops working at once, every other keeps working. Cost: as `add_operator`."""
    with _locked(path) as records:
        if records.pop(name, None) is None:
            raise OperatorError(f"no operator {name!r}" if NAME.fullmatch(name) else "no such operator")


def list_operators(path: Path) -> list[OperatorRecord]:
    """Every named operator, by name. Cost: one read of the operators file."""
    return sorted(_read(path).values(), key=lambda r: r.name)


class Operators:
    """Checks operator credentials for the service: `name(authorization header)` is the operator's name,
    or None for anything else (unknown, expired, malformed). Cost per call: one stat of the operators
    file (read again only when it changed) and a SHA-256; a JWT costs a signature check, and its JWKS
    is read when it changed (a file) or fetched when a token names a key not seen yet (a URL)."""

    def __init__(self, path: Path, shared_token: str = "", jwt_settings: JwtSettings | None = None):
        self.path, self.jwt = path, jwt_settings
        self._shared = _digest(shared_token) if shared_token else None
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._records: dict[str, OperatorRecord] = {}  # by token digest
        self._jwks = _Jwks(jwt_settings.jwks) if jwt_settings else None

    def configured(self) -> bool:
        """Whether any credential could be accepted (none: operator access is off)."""
        return bool(self._shared or self._jwks or self._current())

    def name(self, authorization: str | None, now: datetime | None = None) -> str | None:
        scheme, _, given = (authorization or "").partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given or not given.isascii():
            return None
        digest = _digest(given)
        if digest == self._shared:
            return SHARED
        # A dict lookup by the token's hash: timing can tell at most which hashes are absent, and the
        # hash of a guess says nothing about a real token.
        record = self._current().get(digest)
        if record is not None:
            return None if record.expired(now or datetime.now(UTC)) else record.name
        if self._jwks is not None and given.count(".") == 2:
            return self._verified(given)
        return None

    def _current(self) -> dict[str, OperatorRecord]:
        try:
            stat = self.path.stat()
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            seen = None
        with self._lock:
            if seen != self._seen:
                try:
                    self._records = {r.token_sha256: r for r in _read(self.path).values()} if seen else {}
                except OperatorError as exc:  # a broken file lets nobody in, and says why in the log
                    log.warning("operators file: %s", exc)
                    self._records = {}
                self._seen = seen
            return self._records

    def _verified(self, token: str) -> str | None:
        settings = self.jwt
        assert settings is not None and self._jwks is not None
        try:
            key = self._jwks.key(jwt.get_unverified_header(token).get("kid"))
            claims = jwt.decode(token, key, algorithms=list(settings.algorithms), audience=settings.audience,
                                issuer=settings.issuer, leeway=settings.leeway_seconds,
                                options={"require": ["exp"], "verify_aud": settings.audience is not None})
        except (jwt.PyJWTError, OperatorError) as exc:
            log.info("operator JWT refused: %s", type(exc).__name__)  # the type only: messages quote claims
            return None
        subject = claims.get(settings.name_claim)
        if not isinstance(subject, str) or not subject.strip() or len(subject) > 200:
            return None
        return f"jwt:{subject.strip()}"


class _Jwks:
    """The signing keys of a JWKS file (read again when it changes) or URL (PyJWKClient: cached, fetched
    again for a key id it does not know)."""

    def __init__(self, source: str):
        self.source = source
        self._client = jwt.PyJWKClient(source, timeout=5) if source.startswith(("https://", "http://")) else None
        self._seen: tuple[int, int, int] | None = None
        self._keys: dict[str | None, Any] = {}
        self._lock = threading.Lock()

    def key(self, kid: str | None) -> Any:
        if self._client is not None:
            try:
                return self._client.get_signing_key(kid).key if kid else self._client.get_signing_keys()[0].key
            except jwt.PyJWKClientError as exc:
                raise OperatorError(f"JWKS: {first_line(exc)}") from None
        path = Path(self.source)
        with self._lock:
            try:
                stat = path.stat()
                seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if seen != self._seen:
                    found = jwt.PyJWKSet.from_json(path.read_text(encoding="utf-8"))
                    self._keys = {k.key_id: k.key for k in found.keys}
                    self._seen = seen
            except (OSError, jwt.PyJWKSetError) as exc:
                raise OperatorError(f"JWKS file {path}: {first_line(exc)}") from None
            if kid is None and len(self._keys) == 1:
                return next(iter(self._keys.values()))
            if kid not in self._keys:
                raise OperatorError("the token's key id is not in the JWKS")
            return self._keys[kid]


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _read(path: Path) -> dict[str, OperatorRecord]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise OperatorError(f"the operators file {path} cannot be read: {first_line(exc)}") from None
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT or not isinstance(raw.get("operators"), dict):
        raise OperatorError(f"the operators file {path} is not in format {_FORMAT}")
    try:
        return {name: OperatorRecord(name, entry["token_sha256"], datetime.fromisoformat(entry["created"]),
                                     datetime.fromisoformat(entry["expires"]) if entry.get("expires") else None)
                for name, entry in raw["operators"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise OperatorError(f"the operators file {path} has a malformed entry: {type(exc).__name__}") from None


@contextmanager
def _locked(path: Path) -> Iterator[dict[str, OperatorRecord]]:
    """The operators by name, written back atomically (owner-only) if the block ends without an error.
    An exclusive lock on `<file>.lock` keeps two commands from losing each other's change."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = _read(path)
        yield records
        document = {"format": _FORMAT, "operators": {
            r.name: {"token_sha256": r.token_sha256, "created": r.created.isoformat(),
                     "expires": r.expires.isoformat() if r.expires else None}
            for r in sorted(records.values(), key=lambda r: r.name)}}
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
