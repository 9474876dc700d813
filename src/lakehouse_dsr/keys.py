"""Secrets and private files: the HMAC key and its keyring, keyed hashes (HMAC-SHA256) of
identifiers (what the ledger keeps once a request is complete), keys derived from it, and the
owner-only file and folder helpers every package writes keys, evidence and packages with.

The same HMAC is computed in Python (here, for submitted identifiers) and as a Spark expression
(lake/hmac.py, for table values), so completed requests can be re-verified without any plaintext
identifier.

Rotation: `rotate_key` moves the active key to the keyring of retired keys (`<key file>.retired`,
0600, one hex key per line) and writes a new one. Every stored hash names the key that made it
(`key_id`, 8 hex digits of the key's SHA-256), so a check computes candidate hashes under each key
of the ring and compares each stored hash only with the candidates of its own key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exceptions import ConfigError

KEY_ENV = "DSR_SECRET_KEY"
RETIRED_SUFFIX = ".retired"


def load_key(key_file: Path) -> bytes:
    """The HMAC key: $DSR_SECRET_KEY if set, else the key file (created 0600 with 32 random bytes)."""
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode("utf-8")
    if not key_file.exists():
        # Written aside, then linked into place: of processes or threads starting at once exactly one
        # key wins, and none reads a key file that is still empty.
        key_file.parent.mkdir(parents=True, exist_ok=True)
        draft = key_file.with_name(f".{key_file.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(draft, key_file)
        except FileExistsError:
            pass
        finally:
            os.unlink(draft)
    return bytes.fromhex(read_private(key_file, "key file").strip())


def read_private(path: Path, what: str) -> str:
    """The text of a key file, refused (ConfigError) when others may read it."""
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"{what} {path} is readable by others; run: chmod 600 {path}")
    return path.read_text()


def key_id(key: bytes) -> str:
    """Names a key in the ledger (`request_keys.key_id`): the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key).hexdigest()[:8]


def retired_file(key_file: Path) -> Path:
    """The keyring of retired keys, next to the key file: `dsr-secret.key.retired`."""
    return key_file.with_name(key_file.name + RETIRED_SUFFIX)


def load_retired(key_file: Path) -> tuple[bytes, ...]:
    """The retired keys (oldest first); none if the keyring file does not exist."""
    path = retired_file(key_file)
    if not path.exists():
        return ()
    keys = []
    for number, line in enumerate(read_private(path, "retired key file").splitlines(), start=1):
        if line.strip():
            try:
                keys.append(bytes.fromhex(line.strip()))
            except ValueError:
                raise ConfigError(f"retired key file {path} line {number} is not a hex key") from None
    return tuple(keys)


@dataclass(frozen=True)
class Keyring:
    """The active key (makes every new hash, or wraps every new data key: vault/keys.py) and the
    retired ones (still check the hashes they made, or unwrap what they wrapped)."""

    active: bytes
    retired: tuple[bytes, ...] = ()

    @property
    def active_id(self) -> str:
        return key_id(self.active)

    def keys(self) -> dict[str, bytes]:
        """{key_id: key}, active first, newest retired next; a key listed twice counts once."""
        ring: dict[str, bytes] = {}
        for key in (self.active, *reversed(self.retired)):
            ring.setdefault(key_id(key), key)
        return ring


def keys_in_use(ring: Keyring, used: set[str | None]) -> dict[str, bytes]:
    """The keys of `ring` named by `used` (the key ids of stored hashes), to hash with only those;
    every key if some hash has no key id (NULL: made before key ids were recorded) or none is named."""
    keys = ring.keys()
    if None in used or not used & set(keys):
        return keys
    return {i: k for i, k in keys.items() if i in used}


def as_keyring(key: bytes | Keyring, key_file: Path) -> Keyring:
    """A bare key is the active key: the retired keys come from the keyring file next to `key_file`."""
    return key if isinstance(key, Keyring) else Keyring(key, load_retired(key_file))


@dataclass(frozen=True)
class Rotation:
    old_id: str
    new_id: str
    retired_file: Path
    retired: int  # keys in the keyring file now


def rotate_key(key_file: Path) -> Rotation:
    """Retire the key in `key_file` (Settings.key_file()) (appended to `<key file>.retired`, 0600) and write a new one.

    Only files change, in a crash-safe order: the old key is written (and synced) to the keyring
    before the new key replaces it atomically, so no moment exists where a key is lost. Hashes made
    before stay checkable under their retired key; new hashes use the new key.
    """
    retired = retired_file(key_file)
    if os.environ.get(KEY_ENV):
        raise ConfigError(
            f"the HMAC key comes from ${KEY_ENV}; rotate it there: add its hex to {retired} (one key per line, "
            "mode 0600), then set the new key"
        )
    if not key_file.exists():
        raise ConfigError(f"no key file at {key_file}: nothing to rotate")
    try:
        old = load_key(key_file)
    except ValueError:
        raise ConfigError(f"the key file {key_file} does not hold a hex key: nothing was rotated") from None
    if not old:
        raise ConfigError(f"the key file {key_file} is empty: nothing was rotated")
    kept = load_retired(key_file)
    if key_id(old) not in {key_id(k) for k in kept}:  # a rotation that crashed after this step did it already
        text = retired.read_text() if retired.exists() else ""
        if text and not text.endswith("\n"):
            text += "\n"
        write_private(retired, f"{text}{old.hex()}\n")
        kept = (*kept, old)
    new = secrets.token_bytes(32)
    write_private(key_file, new.hex())
    return Rotation(key_id(old), key_id(new), retired, len(kept))


def write_private(path: Path, data: str | bytes, sync: bool = True) -> None:
    """Replace `path` atomically with `data` (text as UTF-8), mode 0600 from its creation: a crash never
    leaves half a file. `sync`: the file and its folder are synced to disk before this returns (about
    1 ms a file here)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older temp file keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def private_dir(path: Path) -> Path:
    """Create `path` and every missing parent owner-only (mkdir's parents ignore the mode)."""
    for folder in reversed([p for p in (path, *path.parents) if not p.exists()]):
        folder.mkdir(mode=0o700)
        folder.chmod(0o700)
    path.chmod(0o700)
    return path


def derive_key(key: bytes, purpose: str) -> bytes:
    """A key for one purpose (status tokens, certificate signatures, ...) from an engine key: a MAC made
    for one purpose is never valid for another, nor a subject hash."""
    return hmac.new(key, purpose.encode(), hashlib.sha256).digest()


def keyed_hash(key: bytes, value: str) -> str:
    """HMAC-SHA256 of `value` under `key`, as hex. Cost: about 0.7 µs: the key's padded hash states
    are made once per key and copied (hmac.new or hmac.digest redo them per value, 2-4 µs; a million
    subjects are hashed at every submission of a million requests)."""
    inner, outer = _pads(key)
    digest = inner.copy()
    digest.update(value.encode("utf-8"))
    mac = outer.copy()
    mac.update(digest.digest())
    return mac.hexdigest()


@functools.lru_cache(maxsize=16)
def _pads(key: bytes) -> tuple[Any, Any]:
    """HMAC's inner and outer SHA-256 states for `key` (RFC 2104)."""
    block = (hashlib.sha256(key).digest() if len(key) > 64 else key).ljust(64, b"\0")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in block)), hashlib.sha256(bytes(b ^ 0x5C for b in block)))
