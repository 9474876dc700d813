"""The vault's master key: wraps every subject's data key (AES-256-GCM) and never enters a table.

Where it comes from: `$DSR_VAULT_KEY` (64 hex digits) if set, else the key file `dsr-vault.key`
beside the HMAC key file (0600, created with 32 random bytes the first time a vault is made).
Retired master keys (`dsr-vault.key.retired`, one hex key per line) still unwrap entries a
rotation has not re-wrapped yet; once it has, they are dropped (vault/vault.py `rotate_master_key`).
Every wrapped key names the master key that wrapped it (`master_key_id`, as ledger key ids), so a
wrong or missing master key is found before anything changes.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from ..config import Settings
from ..exceptions import ConfigError
from ..keys import Keyring, key_id, load_retired, read_private, retired_file, write_private

VAULT_KEY_ENV = "DSR_VAULT_KEY"
KEY_BYTES = 32  # AES-256


@dataclass(frozen=True)
class MasterKeys(Keyring):
    """The master keys as a keyring: `keys()` is {master_key_id: key}; `from_env`: the active one is
    $DSR_VAULT_KEY (rotation then re-wraps to it instead of writing a new key)."""

    from_env: bool = False


def master_key_file(settings: Settings) -> Path:
    """`dsr-vault.key`, in the folder of the HMAC key file."""
    return settings.key_file().with_name("dsr-vault.key")


def _parse(text: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ConfigError(f"the vault master key in {where} is not hex; it must be {2 * KEY_BYTES} hex digits "
                          f"({KEY_BYTES} bytes)") from None
    if len(key) != KEY_BYTES:
        raise ConfigError(f"the vault master key in {where} has {len(key)} bytes; it must have {KEY_BYTES} "
                          f"({2 * KEY_BYTES} hex digits)")
    return key


def load_master_keys(settings: Settings, create: bool = False) -> MasterKeys:
    """The master keys. `create`: make the key file if there is none (only for a vault with no entries
    yet, which the caller knows); otherwise a missing key is a ConfigError, as a new key could not
    unwrap anything already stored."""
    path = master_key_file(settings)
    env = os.environ.get(VAULT_KEY_ENV)
    if env:
        return MasterKeys(_parse(env, f"${VAULT_KEY_ENV}"), load_retired(path), from_env=True)
    if path.exists():
        return MasterKeys(_parse(read_private(path, "vault key file"), str(path)), load_retired(path))
    if not create:
        raise ConfigError(f"no vault master key: set ${VAULT_KEY_ENV} or restore the key file {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, secrets.token_hex(KEY_BYTES))
    return MasterKeys(_parse(path.read_text(), str(path)))


def new_master_key(settings: Settings, current: MasterKeys) -> MasterKeys:
    """Retire the active master key (appended to the keyring file first, synced) and write a new one.
    Crash-safe like the HMAC key rotation: at no moment is a key that wraps stored entries lost."""
    path = master_key_file(settings)
    retired = retired_file(path)
    kept = load_retired(path)
    if current.active_id not in {key_id(k) for k in kept}:
        text = retired.read_text() if retired.exists() else ""
        write_private(retired, f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{current.active.hex()}\n")
        kept = (*kept, current.active)
    write_private(path, secrets.token_hex(KEY_BYTES))
    return MasterKeys(_parse(path.read_text(), str(path)), kept)


def drop_retired(settings: Settings, keep: set[str]) -> int:
    """Rewrite the retired keyring with only the keys named in `keep` (those some entry still needs);
    returns how many were dropped."""
    path = master_key_file(settings)
    kept = load_retired(path)
    still = [k for k in kept if key_id(k) in keep]
    if len(still) != len(kept):
        write_private(retired_file(path), "".join(f"{k.hex()}\n" for k in still))
    return len(kept) - len(still)
