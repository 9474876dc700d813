"""Legal holds: `<ns>.holds`, data that must not be erased while a legal obligation or a claim needs
it (GDPR Art. 17(3)(b) and (e), CCPA §1798.105(d)).

A hold names a subject or a mapped table, with a reason, who placed it, when, and optionally the
last day it applies (`until`). A subject is stored as its keyed hash (HMAC-SHA256 under the
ledger's key, with the key's id, like the consent table), never in plaintext. A hold is active
until released or past its `until` day; a released hold keeps its row (who released it, when), so
the table is also the holds' audit trail, and each change appends an audit event too.

While a hold is active, `dsr run` executes no erase request of a held subject (status `held`, with
the hold's reason) and erases and purges nothing in a held table (runner/work.py); the first run
after the hold ends resumes them. These are not the *collateral* holds of the step journal
(journal.py, lifted by `dsr release`), which stop every erasure after an erase commit changed rows
nobody asked about. No JVM: read and written through pyiceberg like the rest of the ledger.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import Settings
from ..exceptions import LedgerError, RequestInputError
from ..keys import keyed_hash
from .ledger import Ledger
from .requests import utc_now
from .store import EqualTo

HoldKind = Literal["subject", "table"]


class Hold(BaseModel):
    """One legal hold, as the ledger stores it (no plaintext subject)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hold_id: str = Field(description="hold-<16 hex digits>")
    kind: HoldKind
    table_name: str | None = Field(None, description="the held table (kind table)")
    subject_hash: str | None = Field(None, description="keyed hash of the held subject (kind subject)")
    key_id: str | None = Field(None, description="the key that made subject_hash")
    reason: str
    until: date | None = Field(None, description="the last day the hold applies (null: until released)")
    created_at: datetime
    created_by: str
    released_at: datetime | None = None
    released_by: str | None = None

    def active(self, today: date) -> bool:
        return self.released_at is None and (self.until is None or today <= self.until)

    @property
    def target(self) -> str:
        """What is held, in words that never hold an identifier."""
        return f"table {self.table_name}" if self.kind == "table" else "subject"

    @property
    def why(self) -> str:
        """The status reason of a request this hold stops: the hold, its reason and its end."""
        end = f" until {self.until}" if self.until else " until released"
        return f"legal hold {self.hold_id} on {self.target}: {self.reason}{end}"


@dataclass(frozen=True)
class ActiveHolds:
    """The holds active on one day, to ask whether a subject or a table is held. Cheap to ask: one
    HMAC per key the subject holds were made with."""

    holds: tuple[Hold, ...]
    keys: dict[str, bytes]  # the ledger's keyring: {key_id: key}

    @property
    def tables(self) -> dict[str, Hold]:
        """{held table: its (first) hold}."""
        found: dict[str, Hold] = {}
        for h in self.holds:
            if h.kind == "table" and h.table_name:
                found.setdefault(h.table_name, h)
        return found

    def subject(self, subject_id: str) -> Hold | None:
        """The hold on `subject_id`, if any (matched by keyed hash under the key that made it)."""
        for h in self.holds:
            key = self.keys.get(h.key_id or "")
            if h.kind == "subject" and key is not None and keyed_hash(key, subject_id) == h.subject_hash:
                return h
        return None

    def table(self, table: str) -> Hold | None:
        return self.tables.get(table)


def active_holds(ledger: Ledger, today: date | None = None) -> ActiveHolds:
    """The holds active on `today` (default: the current UTC date). For retention and any other
    deletion than a request's: skip a row when `active_holds(...).subject(its subject)` or
    `.table(its table)` is not None, and report the hold. Cost: one read of the holds table."""
    today = today or utc_now().date()
    active = tuple(h for h in list_holds(ledger) if h.active(today))
    # the key file is read only when a subject is held: a run with nothing held touches no key
    return ActiveHolds(active, ledger.keyring.keys() if any(h.kind == "subject" for h in active) else {})


def list_holds(ledger: Ledger) -> list[Hold]:
    """Every hold, active, expired or released, oldest first. Cost: one read of the holds table."""
    rows = ledger.store.rows("holds")
    return sorted((Hold.model_validate(r) for r in rows), key=lambda h: (h.created_at, h.hold_id))


def parse_until(text: str) -> date:
    """A hold's last day from YYYY-MM-DD; RequestInputError naming the field."""
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        shown = repr(text) if len(text) <= 40 and text.isprintable() else "(value not shown)"
        raise RequestInputError(f"until: {shown} is not a date (expected YYYY-MM-DD)") from None


def add_hold(ledger: Ledger, reason: str, by: str, subject: str | None = None, table: str | None = None,
             until: date | None = None, now: datetime | None = None) -> Hold:
    """Place a hold on a subject or on a mapped table (exactly one). Everything is checked before
    anything is written (RequestInputError naming the field). Cost: one HMAC, one append to the
    holds table and one to the audit table."""
    now = now or utc_now()
    _check(ledger.settings, reason, by, subject, table, until, now.date())
    ring = ledger.keyring
    hold = Hold(hold_id=f"hold-{secrets.token_hex(8)}", kind="subject" if subject is not None else "table",
                table_name=table, subject_hash=keyed_hash(ring.active, subject) if subject is not None else None,
                key_id=ring.active_id if subject is not None else None, reason=reason.strip(), until=until,
                created_at=now, created_by=by)
    ledger.store.append("holds", [hold.model_dump()])
    ledger.audit([(None, None, "hold_added", {"hold_id": hold.hold_id, "on": hold.target, "reason": hold.reason,
                                              "until": until.isoformat() if until else None, "by": by})], now)
    return hold


def release_hold(ledger: Ledger, hold_id: str, by: str, now: datetime | None = None) -> Hold:
    """Release an active hold: its row keeps who released it and when. LedgerError for an unknown or
    already released hold (nothing written). Cost: one read and rewrite of the hold's row, one audit
    append."""
    now = now or utc_now()
    if not by.strip():
        raise RequestInputError("by: who releases the hold must be named")
    released: list[Hold] = []

    def change(rows: list[dict]) -> list[dict]:
        if not rows:
            raise _unknown(hold_id)
        hold = Hold.model_validate(rows[0])
        if hold.released_at is not None:
            raise LedgerError(f"hold: {hold_id} was already released on {hold.released_at:%Y-%m-%d} "
                              f"by {hold.released_by}")
        released[:] = [hold.model_copy(update={"released_at": now, "released_by": by})]
        return [released[0].model_dump()]

    if not ledger.store.rows("holds", EqualTo("hold_id", hold_id), ("hold_id",)):  # a read creates no table
        raise _unknown(hold_id)
    ledger.store.replace("holds", "hold_id", [hold_id], change)
    ledger.audit([(None, None, "hold_released", {"hold_id": hold_id, "on": released[0].target, "by": by})], now)
    return released[0]


def _unknown(hold_id: str) -> LedgerError:
    return LedgerError(f"hold: no hold {hold_id!r} in the ledger (see dsr hold list)")


def _check(settings: Settings, reason: str, by: str, subject: str | None, table: str | None, until: date | None,
           today: date) -> None:
    if (subject is None) == (table is None):
        raise RequestInputError("subject/table: give exactly one of them (--subject ID or --table T)")
    if subject is not None and not subject.strip():
        raise RequestInputError("subject: the subject id is empty")
    if table is not None:
        try:
            settings.datamap.table_mapping(table)
        except KeyError:
            raise RequestInputError(f"table: {table!r} is not a table of the data map") from None
        if table in settings.datamap.shredded:  # the vault's per-subject keys serve every shredded table at once
            raise RequestInputError(f"table: {table} is erased by crypto-shredding, which no table hold can "
                                    "suspend; hold its subjects instead (--subject)")
    if not reason.strip():
        raise RequestInputError("reason: a hold needs a reason (it is told to the data subject)")
    if not by.strip():
        raise RequestInputError("by: who places the hold must be named")
    if until is not None and until < today:
        raise RequestInputError(f"until: {until} is in the past")
