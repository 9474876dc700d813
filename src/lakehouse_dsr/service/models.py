"""What the intake service answers, as models: each endpoint declares one (service/app.py), so the
OpenAPI document (`/api/v1/openapi.json`) describes every answer, errors included.

The models describe the JSON the endpoints have always returned, field for field and in the same
order: scripts rely on it. None of them holds a subject identifier. Fields that are left out when
they do not apply are optional without `null` in their schema; fields that are always there but may
be `null` are required and nullable.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from ..evidence.handoff import ExternalReference
from ..ledger.holds import Hold
from ..ledger.requests import Regulation, RequestType

# Every state a request shows: in the intake queue (identity_unverified, locked, received), then in
# the ledger (received, in_progress while a run works on it, erased awaiting the batched purge,
# failed, completed).
RequestState = Literal["identity_unverified", "locked", "received", "in_progress", "erased", "failed", "held",
                       "completed"]
RequestId = Annotated[str, Field(pattern=r"^req-[0-9a-f]{21}$", description="the request's id")]
Timestamp = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$", description="UTC, to the second",
                                 json_schema_extra={"format": "date-time"})]
Day = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$", json_schema_extra={"format": "date"})]


def _no_default(schema: dict[str, Any]) -> None:
    """A field left out of the answer when it does not apply (never `null`): no `default` in its schema."""
    schema.pop("default", None)


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- the person's side ------------------------------------------------------------------------------

class Acknowledgement(_Answer):
    """A filing that is on disk in the intake queue (202): it reaches the ledger exactly once, under
    `request_id`, even if the server dies now."""

    request_id: RequestId
    status: Literal["received", "identity_unverified", "locked"] = Field(
        description="identity_unverified: a verification code is mailed (erase, access and opt-in under "
                    "`intake.verification: email_code`); locked: only on a replay of a request locked since")
    due_date: Day = Field(description="the day the regulation's deadline falls on")
    status_token: str = Field(description="the person's key to this request's status: send it as X-Status-Token "
                                          "(or ?status_token=); it is not stored anywhere")
    gpc_opt_out_request_id: RequestId | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="the CCPA opt-out recorded beside the request because the browser sent Sec-GPC: 1 (absent "
                    "otherwise, and when the filing is that opt-out)")
    replayed: bool = Field(description="the Idempotency-Key was seen before: this is the first answer, again")


class RequestStatus(_Answer):
    """A request as the person who holds its status token sees it (no subject identifier)."""

    request_id: RequestId
    type: RequestType
    regulation: Regulation
    status: RequestState
    reason: str | None = Field(description="why it is in this state, in words (null: nothing to say)")
    received: Timestamp
    due_date: Day = Field(description="the deadline, the one allowed extension included")
    days_left: int | None = Field(description="days until the deadline, negative when late (null once completed)")
    extended: bool = Field(description="the deadline was extended (once, as the regulation allows)")
    completed: Timestamp | None = Field(description="when it was completed (null until then)")
    external_reference: ExternalReference | None = Field(
        description="the id another privacy tool gave the request it handed over (null: filed here)")


# -- the operator's side ----------------------------------------------------------------------------

class OperatorRequest(_Answer):
    """A request as an operator sees it: queued or in the ledger, never with its subject."""

    request_id: RequestId
    request_type: RequestType
    regulation: Regulation
    status: RequestState
    status_reason: str | None = Field(description="why it is in this state, in words (null: nothing to say)")
    received: Timestamp
    due_date: Day = Field(description="the deadline, the one allowed extension included")
    days_left: int | None = Field(description="days until the deadline, negative when late (null once completed)")
    extended: bool
    completed: Timestamp | None = Field(description="when it was completed (null until then)")
    purge_by: Day | None = Field(description="status erased: the day the batched physical purge is due by")
    external_reference: ExternalReference | None = Field(
        description="the id another privacy tool gave the request it handed over (null: filed here)")


class RequestList(_Answer):
    """Requests matching the filters, most urgent first (fewest days left; completed ones last)."""

    count: int = Field(ge=0, description="the number of requests listed")
    requests: list[OperatorRequest]


class RunTable(_Answer):
    """What one run did in one table."""

    action: str = Field(description="delete, redact, shred, recompute, ... ('aggregate' or 'erased earlier' when the "
                                    "run only verified or purged there)")
    bytes_rewritten: int = Field(description="bytes of data files rewritten by the erase and the purge")
    files_rewritten: int = Field(description="data files rewritten by the erase and the purge")
    rows: int = Field(description="rows erased or redacted (0 for aggregates recomputed and tables shredded)")


class Run(_Answer):
    """One `dsr run` that did work, from the ledger's run history."""

    run_id: str
    started_at: str = Field(description="ISO-8601, with its UTC offset", json_schema_extra={"format": "date-time"})
    finished_at: str = Field(description="ISO-8601, with its UTC offset", json_schema_extra={"format": "date-time"})
    seconds: dict[str, float] = Field(description="seconds per stage")
    tables: dict[str, RunTable] = Field(description="per table (by name)")
    requests_completed: int
    requests_failed: int
    requests_erased: int = Field(description="erased, awaiting the batched physical purge")


class RunList(_Answer):
    """The last runs, newest first."""

    runs: list[Run]


class TableTotal(_Answer):
    """One table over every recorded run."""

    table: str
    rows: int = Field(description="rows erased or redacted")
    bytes_rewritten: int
    runs: int = Field(description="runs that worked on the table (erased, purged or verified there)")


class TableTotals(_Answer):
    """Per table, sorted by name."""

    tables: list[TableTotal]


class HoldRecord(_Answer):
    """A legal hold as operators see it: what is held (a table by name; a subject never, not even as
    its keyed hash), why, until when, who placed and released it."""

    hold_id: str
    kind: Literal["subject", "table"]
    table: str | None = Field(description="the held table (kind table)")
    reason: str
    until: date | None = Field(description="the last day it applies (null: until released)")
    active: bool = Field(description="in force today")
    created_at: datetime
    created_by: str
    released_at: datetime | None
    released_by: str | None

    @classmethod
    def of(cls, hold: Hold, today: date) -> HoldRecord:
        return cls(hold_id=hold.hold_id, kind=hold.kind, table=hold.table_name, reason=hold.reason, until=hold.until,
                   active=hold.active(today), created_at=hold.created_at, created_by=hold.created_by,
                   released_at=hold.released_at, released_by=hold.released_by)


class HoldList(_Answer):
    holds: list[HoldRecord]


class Ingested(_Answer):
    moved: int = Field(ge=0, description="acknowledged requests moved into the ledger now")


class Health(_Answer):
    ok: Literal[True] = Field(description="the process answers")


ReadinessPart = Literal["queue", "ledger", "ingester"]


class Readiness(_Answer):
    """Whether this instance can take and keep requests now (200), or which part cannot (503)."""

    ready: bool
    failing: list[ReadinessPart] = Field(description="the parts not ready (empty when ready)")
    queue: bool = Field(description="the durable queue takes a write")
    ledger: bool = Field(description="the ledger's catalog answers")
    ingester: bool = Field(description="the ingester process runs and has opened the queue and the ledger")


# -- refusals ---------------------------------------------------------------------------------------

class Refusal(_Answer):
    """Any refusal: what is wrong, in words that never quote an identifier."""

    detail: str
    field: str | SkipJsonSchema[None] = Field(None, json_schema_extra=_no_default,
                                              description="the field or header at fault, when there is one")


class Problem(_Answer):
    field: str = Field(description="where: a field, `query.<name>`, `body`, or a position in malformed JSON")
    message: str = Field(description="why, without the value sent")


class InvalidInput(_Answer):
    """A request the schema refuses (422): every problem, each naming its field and never its value."""

    detail: str = Field(description="the problems in one line, `field: message; ...`")
    errors: list[Problem]
