"""The documents exchanged with other privacy tools (fides, Transcend, DataGrail, Ketch...): the
webhook event the service POSTs on a request's status change (service/webhooks.py), and the batch of
requests such a tool hands over (`POST /api/v1/operator/requests/batch`) with the answer to it.

Their JSON Schemas are published (schemas/webhook-event, request-batch, request-batch-result). No
event holds a subject identifier: a request's id, type, regulation, status, reason, the other tool's
reference and the certificate's id and digest only. A batch carries subject identifiers in; its answer
and its refusals never carry them back out.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import WebhookEvent as EventName
from ..ledger.requests import NOT_BLANK, Regulation, RequestType

_RequestId = Annotated[str, Field(pattern=r"^req-[0-9a-f]{21}$", description="the request's id in this engine")]
_Timestamp = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$", description="UTC, to the second",
                                  json_schema_extra={"format": "date-time"})]
Source = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,39}$",
                              description="the tool that handed the request over, in lower case (fides, transcend, "
                                          "datagrail, ketch, ...)")]
ExternalId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
                                  description="the tool's own id of the request (printable ASCII, no spaces)")]


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ExternalReference(_Document):
    """The id another privacy tool gave a request it handed over."""

    source: Source
    id: ExternalId


# -- outgoing: the webhook event ---------------------------------------------------------------------

class EventRequest(_Document):
    """The request an event is about (never its subject)."""

    request_id: _RequestId
    type: RequestType
    regulation: Regulation
    status: Literal["received", "held", "completed", "failed"] = Field(
        description="its status after the change (a verified request is `received`: it waits for a run)")
    reason: str | None = Field(description="why, in words (a hold's reason, a failure's cause; null: nothing to say)")
    external_reference: ExternalReference | None = Field(
        description="the other tool's id, for a request it handed over (null otherwise)")


class CertificateReference(_Document):
    """The signed certificate of a completed request, which operators download from
    `GET /api/v1/operator/requests/{request_id}/certificate`."""

    id: _RequestId = Field(description="a certificate is issued per completed request: its id is the request's")
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$",
                        description="SHA-256 of the certificate's canonical JSON (sorted keys, separators `,` and "
                                    "`:`, ASCII) without `issued_at` and `signature`: the same for every copy issued")
    key_id: str = Field(pattern=r"^[0-9a-f]{8}$", description="the engine key that signs it now")


class WebhookEventDocument(_Document):
    """What an endpoint of `webhooks:` receives as the body of a POST, signed in the header
    `X-DSR-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the endpoint's secret>`.
    Delivered at least once: an event may come twice (after a timeout, a restart); `id` tells."""

    id: str = Field(pattern=r"^[0-9a-f]{32}$", description="the event's id: the same on every attempt")
    event: EventName = Field(description="received (in the ledger), verified (the identity was verified), held (a "
                                         "legal hold stops it), completed (done and proven), failed (the last run "
                                         "could not complete it; the next tries again)")
    occurred: _Timestamp = Field(description="when the status changed")
    request: EventRequest
    certificate: CertificateReference | None = Field(
        description="event completed: the request's certificate (null for other events, and for a completed "
                    "request whose record has expired)")


# -- incoming: a batch of requests from another tool ----------------------------------------------------

class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BatchItem(_Body):
    """One request another tool received and verified."""

    external_id: ExternalId
    type: RequestType
    subject_id: str = Field(min_length=1, max_length=1000, pattern=NOT_BLANK,
                            description="the person, as the data map names them")
    regulation: Regulation = "gdpr"
    received_at: str | None = Field(
        None, pattern=r"^[1-9]\d{3}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$",
        json_schema_extra={"format": "date-time"},
        description="when the tool received it (with its UTC offset; not in the future): the deadline runs from "
                    "then (default: now)")


class RequestBatch(_Body):
    """Requests handed over by another privacy tool, each under the tool's own id. Idempotent per
    (source, external_id); an external id twice in one batch is refused (409) and nothing is filed."""

    source: Source
    requests: list[BatchItem] = Field(min_length=1, max_length=500)


class BatchItemResult(_Document):
    """What became of one request of a batch, in the batch's order."""

    external_id: ExternalId
    request_id: _RequestId
    result: Literal["created", "existing", "conflict"] = Field(
        description="created: filed now; existing: this external id was handed over before with the same request, "
                    "whose id this is; conflict: it was handed over before with a different request (type, "
                    "regulation or subject), which is kept as it was: nothing was filed")
    due_date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", json_schema_extra={"format": "date"},
                          description="the day the regulation's deadline falls on")


class BatchResult(_Document):
    """The answer to a batch (202): every request is on disk in the durable queue (or was before)."""

    source: Source
    created: int = Field(ge=0)
    existing: int = Field(ge=0)
    conflicts: int = Field(ge=0)
    requests: list[BatchItemResult]


def json_schemas() -> dict[str, dict]:
    """The published JSON Schemas of the hand-off documents, by file stem."""
    return {"webhook-event": WebhookEventDocument.model_json_schema(),
            "request-batch": RequestBatch.model_json_schema(),
            "request-batch-result": BatchResult.model_json_schema()}
