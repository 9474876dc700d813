"""Consent to the sale/sharing of personal data: `<ns>.consent`, one row per subject who filed an
opt-out or opt-in, holding only the subject's keyed hash, the key that made it (`key_id`), whether
they are opted out, and the request that decided it.

A subject's row is found by hashing the subject id under every key of the ring, so rows made
before a key rotation keep matching; each change rewrites the subject's row under the active key.
No JVM: read and written through pyiceberg like the rest of the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..keys import keyed_hash
from .ledger import Ledger
from .requests import utc_now
from .store import EqualTo


@dataclass(frozen=True)
class ConsentChange:
    """What one open opt_out (opted_out=True) or opt_in (False) request asks for."""

    request_id: str
    subject_id: str
    opted_out: bool
    received_at: datetime


def record(ledger: Ledger, changes: list[ConsentChange], now: datetime | None = None) -> dict[str, str]:
    """Make each subject's newest change (by received time, then request id) their consent state, in
    one commit that replaces their row (made under any key of the ring) with one under the active key.

    Returns {request_id: the newer request of the same subject in `changes` that overrode it}.
    Cost: one HMAC per subject and key in the driver, one read of the consent rows of these
    subjects (pruned by hash), one commit.
    """
    latest: dict[str, ConsentChange] = {}
    overridden: dict[str, str] = {}
    for change in sorted(changes, key=lambda c: (c.received_at, c.request_id)):
        if change.subject_id in latest:
            overridden[latest[change.subject_id].request_id] = change.request_id
        latest[change.subject_id] = change
    if not latest:
        return overridden
    ring = ledger.keyring
    keys = ring.keys()
    now = now or utc_now()
    rows = [{"subject_hash": keyed_hash(ring.active, subject), "key_id": ring.active_id, "opted_out": c.opted_out,
             "request_id": c.request_id, "updated_at": now} for subject, c in latest.items()]
    every_hash = [keyed_hash(key, subject) for subject in latest for key in keys.values()]
    ledger.store.replace("consent", "subject_hash", every_hash, lambda _current: rows)
    return overridden


def opted_out(ledger: Ledger) -> list[dict]:
    """(subject_hash, key_id, request_id) of every subject opted out now. One read of the consent table."""
    return ledger.store.rows("consent", EqualTo("opted_out", True), ("subject_hash", "key_id", "request_id"))
