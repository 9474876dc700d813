"""`dsr serve`: the HTTP intake service (FastAPI on uvicorn), a thin shell over intake.py and the ledger.

People file requests and follow them (`/api/v1/requests`, the pages `/` and `/status`); named
operators (operators.py: tokens in the operators file, `$DSR_API_TOKEN` as the operator `default`, or
JWTs) list and extend requests, read runs and download certificates (`/api/v1/operator/...`, the page
`/dashboard`), each call recorded in the ledger's audit under the operator's name. Load balancers and
monitoring read `/healthz`, `/readyz` and `/metrics`. No answer ever holds a subject identifier: error
messages name the field, never its value, and no stack trace leaves the process.

Every endpoint declares what it answers (service/models.py, and the certificate's own model), its
refusals included, so the OpenAPI document (`/api/v1/openapi.json`) describes every answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib import resources
from typing import Annotated, Any, Literal, get_args

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from ..config import Settings
from ..evidence.certificate import Certificate, build_certificate, certificate_html
from ..evidence.handoff import BatchResult, ExternalReference, RequestBatch
from ..exceptions import DsrError, LedgerError, RequestInputError, first_line
from ..ledger.holds import add_hold, list_holds, parse_until, release_hold
from ..ledger.ledger import RequestStatus
from ..ledger.requests import MAX_SUBJECT_LENGTH, NOT_BLANK, REQUEST_ID, SPACE, utc_now
from . import models
from .guard import Guard
from .intake import (
    EARLIEST_RECEIPT,
    EMAIL,
    EMAIL_MAX_LENGTH,
    VERIFIED_TYPES,
    Filing,
    Intake,
    IntakeError,
)
from .metrics import Metrics
from .operators import Operators, operators_file
from .queue import QueueUnavailableError

TOKEN_ENV = "DSR_API_TOKEN"
log = logging.getLogger("lakehouse_dsr.service")
PAGES = resources.files("lakehouse_dsr.service") / "pages"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# Every rule Intake.file checks, stated here too so that the schema says it (an e-mail address required
# under `intake.verification: email_code` is added to the document by create_app)
class FilingBody(_Body):
    type: Literal["erase", "access", "opt_out", "opt_in"]
    subject_id: str = Field(min_length=1, max_length=MAX_SUBJECT_LENGTH, pattern=NOT_BLANK,
                            description="not only whitespace")
    regulation: Literal["gdpr", "ccpa"] = "gdpr"
    email: str | None = Field(None, max_length=EMAIL_MAX_LENGTH, pattern=EMAIL)


class CodeBody(_Body):
    code: str = Field(pattern=f"^[{SPACE}]*[0-9]{{6}}[{SPACE}]*$", description="the six digits mailed")


class ExtendBody(_Body):
    reason: str = Field(min_length=1, max_length=2000, pattern=NOT_BLANK)


class HoldBody(_Body):
    """A legal hold on one subject or one mapped table (exactly one of them: the schema says so too)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"oneOf": [
        {"required": ["subject_id"], "properties": {"subject_id": {"type": "string"}, "table": {"type": "null"}}},
        {"required": ["table"], "properties": {"table": {"type": "string"}, "subject_id": {"type": "null"}}}]})

    subject_id: str | None = Field(None, min_length=1, max_length=1000, pattern=NOT_BLANK)
    table: str | None = Field(None, min_length=1, max_length=300)
    reason: str = Field(min_length=1, max_length=2000, pattern=NOT_BLANK, description="told to the data subject")
    until: str | None = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}$", json_schema_extra={"format": "date"},
                              description="the last day the hold applies, YYYY-MM-DD (default: until released)")


def _request_id(request_id: Annotated[str, Path(json_schema_extra={"pattern": f"^{REQUEST_ID.pattern}$"})]) -> str:
    # the schema's pattern is not FastAPI's to enforce: a path that is no request id is no such request
    if not REQUEST_ID.fullmatch(request_id):
        raise IntakeError("no such request", 404)
    return request_id


RequestId = Annotated[str, Depends(_request_id)]


def _operator(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The name of the operator whose credential came (401 for none, an unknown or an expired one)."""
    operators: Operators = request.app.state.operators
    name = operators.name(authorization)
    if name is not None:
        return name
    if not operators.configured():
        raise IntakeError(f"operator access is off: the server has no ${TOKEN_ENV}, no named operator and no "
                          "intake.jwt", 401)
    raise IntakeError("a valid operator bearer token is required", 401)


Operator = Annotated[str, Depends(_operator)]

# When an endpoint refuses (the OpenAPI responses' descriptions)
_NO_REQUEST = "no such request (or not a request id)"
_SCHEMA = ("a parameter or the body does not match the schema, or the body is not JSON (`InvalidInput`: each field "
           "named, never its value)")
# What any path may answer, an API endpoint or not: the outer wall's (guard.py) and an internal error
_EVERY_PATH = {413: "the request body is larger than `intake.max_body_bytes` (declared, streamed, or a Content-Length "
                    "that is not a number)",
               500: "internal error; nothing was acknowledged (the error is logged by type only)"}


def _refusals(specific: dict[int, str], operator: bool = False, engine: bool = True) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of an API endpoint: its own refusals (status: when), and those every API
    endpoint shares (a parameter that does not match the schema, the rate limit, `_EVERY_PATH`), an
    operator endpoint's 401, and the 503 of an endpoint that reads the ledger."""
    found = {422: _SCHEMA, **specific}
    if operator:
        found[401] = "no valid operator credential (unknown, expired, malformed), or operator access is off"
    if engine:
        found[503] = "the ledger cannot be read or written now (its catalog is unreachable, say): nothing was changed"
    found[429] = "too many requests from this address"
    return _responses(found)


def _responses(found: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for `found` (status: when) and `_EVERY_PATH`. Every refusal is `Refusal`; a 422
    may also be `InvalidInput` (FastAPI's own 422 schema is not what this service sends)."""
    found = {**_EVERY_PATH, **found}
    headers = {401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
               429: {"Retry-After": {"description": "seconds until a request is let through again",
                                     "schema": {"type": "integer"}}}}
    return {code: {"model": models.InvalidInput | models.Refusal if code == 422 else models.Refusal,
                   "description": why, **({"headers": headers[code]} if code in headers else {})}
            for code, why in sorted(found.items())}


def _email_required(settings: Settings) -> dict[str, Any] | None:
    """The filing's schema under `intake.verification: email_code`: the request types verified by a mailed
    code need an e-mail address (Intake.file refuses them without one). Merged into the operation."""
    if settings.intake.verification != "email_code":
        return None
    unverified = [t for t in get_args(FilingBody.model_fields["type"].annotation) if t not in VERIFIED_TYPES]
    rule = {"anyOf": [{"properties": {"type": {"enum": unverified}}},
                      {"required": ["email"], "properties": {"email": {"type": "string"}}}]}
    return {"requestBody": {"content": {"application/json": {"schema": rule}}}}


def create_app(settings: Settings, intake: Intake | None = None, operator_token: str | None = None) -> Guard:
    """The service as an ASGI application. `intake` defaults to one on `settings`' ledger and queue,
    started with the application; `operator_token`, the operator `default`'s token, to `$DSR_API_TOKEN`
    (unset: only the named operators of the operators file and `intake.jwt`)."""
    intake = intake or Intake(settings)
    token = operator_token if operator_token is not None else os.environ.get(TOKEN_ENV, "")

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        intake.start()
        yield
        await asyncio.to_thread(intake.close)

    app = FastAPI(title="lakehouse-dsr intake", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/api/v1/openapi.json")
    app.state.intake = intake
    app.state.operators = Operators(operators_file(settings), token, settings.intake.jwt)
    if settings.intake.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.intake.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Idempotency-Key", "X-Status-Token", "Authorization"])
    _errors(app)

    def audited(who: str, action: str, request_id: str | None = None) -> None:
        """Record an operator's call that succeeded: who did what (to which request). Cost: one append to
        the ledger's audit table."""
        intake.ledger.audit([(request_id, None, "operator", {"operator": who, "action": action})])

    # -- the person's side --------------------------------------------------------------------------
    # A gpc_opt_out_request_id of None is left out of the answer (response_model_exclude_none).
    @app.post("/api/v1/requests", status_code=202, response_model_exclude_none=True, responses=_refusals({
        409: "this Idempotency-Key was used for a different request (`field`: Idempotency-Key)",
        422: f"{_SCHEMA}; or a `Refusal` naming `field` (subject_id, email, Idempotency-Key)"}, engine=False),
        openapi_extra=_email_required(settings))
    async def file_request(body: FilingBody,  # the key's bounds in the schema too (Intake.file checks them)
                           idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
                           sec_gpc: Annotated[str | None, Header()] = None) -> models.Acknowledgement:
        """File a request. The answer (202) comes once it is on disk; its status token is the only way to
        follow it. The same Idempotency-Key again answers the first filing (`replayed`)."""
        filing = Filing(body.type, body.subject_id, body.regulation, body.email)
        ack = await asyncio.wrap_future(intake.file(filing, idempotency_key, gpc=(sec_gpc or "").strip() == "1"))
        return models.Acknowledgement.model_validate(asdict(ack))

    @app.get("/api/v1/requests/{request_id}", responses=_refusals({
        403: "the status token does not match this request", 404: _NO_REQUEST}))
    def request_status(request_id: RequestId, status_token: str | None = None,
                       x_status_token: Annotated[str | None, Header()] = None) -> models.RequestStatus:
        """A request's status, for the holder of its status token."""
        return public(intake.status(request_id, x_status_token or status_token))

    @app.post("/api/v1/requests/{request_id}/verify", responses=_refusals({
        400: "wrong code (`detail` says how many tries are left)", 404: _NO_REQUEST,
        409: "the identity is already verified (a code works once), or no code has been sent yet",
        410: "the code has expired: ask for a new one",
        422: f"{_SCHEMA}; or a `Refusal`: the code is six digits", 423: "locked after too many wrong codes"}))
    def verify(request_id: RequestId, body: CodeBody) -> models.RequestStatus:
        """Check the code mailed for a request: right, and the request is received."""
        return public(intake.verify(request_id, body.code))

    @app.post("/api/v1/requests/{request_id}/code", status_code=202, responses=_refusals({
        403: "the status token does not match this request", 404: _NO_REQUEST,
        409: "this request is not waiting for a verification code"}))
    def resend_code(request_id: RequestId, status_token: str | None = None,
                    x_status_token: Annotated[str | None, Header()] = None) -> models.RequestStatus:
        """Mail a new code (the old one stops working)."""
        return public(intake.resend_code(request_id, x_status_token or status_token))

    # -- the operator's side ------------------------------------------------------------------------
    @app.get("/api/v1/operator/requests", responses=_refusals({}, operator=True))
    def list_requests(who: Operator, status: str | None = Query(None, max_length=40),
                      type: str | None = Query(None, max_length=40),
                      regulation: str | None = Query(None, max_length=40)) -> models.RequestList:
        """Every request, queued or in the ledger (`status=open`: any not completed)."""
        found = intake.requests(status, type, regulation)
        references = intake.external_references([r.request_id for r in found])
        audited(who, "list requests")
        return models.RequestList(count=len(found), requests=[_operator_view(r, references) for r in found])

    @app.post("/api/v1/operator/requests/batch", status_code=202, responses=_refusals({
        409: "an external id twice in the batch (`field`: `requests.<n>.external_id`, the second one); nothing "
             "was filed",
        422: f"{_SCHEMA}; or a `Refusal` naming `requests.<n>.subject_id` or `requests.<n>.received_at` (in the "
             f"future, not a real time, or before {EARLIEST_RECEIPT:%Y-%m-%d}); nothing was filed",
        503: "the ledger's audit cannot be written now; the requests are filed (the same batch again answers each "
             "`existing`)"}, operator=True, engine=False))
    async def file_batch(who: Operator, body: RequestBatch) -> BatchResult:
        """File requests another privacy tool received and verified (fides, Transcend, DataGrail, Ketch...),
        each under the tool's id: the answer (202) comes once all are on disk. The same external id again
        answers the request filed for it (`existing`), or `conflict` if it asks something else. Audited per
        request filed, under the operator's name."""
        result = await asyncio.wrap_future(intake.file_batch(body))
        created = [(r.request_id, None, "operator", {"operator": who, "action": "file from " + body.source})
                   for r in result.requests if r.result == "created"]
        await asyncio.to_thread(intake.ledger.audit, created or [(None, None, "operator", {
            "operator": who, "action": "file from " + body.source})])
        return result

    @app.post("/api/v1/operator/requests/{request_id}/extend", responses=_refusals({
        404: _NO_REQUEST, 409: "already extended (the law allows one), completed, or of a type its regulation allows "
                               "no extension (a CCPA opt-out)"}, operator=True))
    def extend(who: Operator, request_id: RequestId, body: ExtendBody) -> models.OperatorRequest:
        """Apply the regulation's one allowed extension; the reason is told to the person."""
        try:
            extended = intake.ledger.extend(request_id, body.reason)
        except RequestInputError as exc:  # no extension for this request: its state, as an extended one's
            raise IntakeError(str(exc), 409) from None
        audited(who, "extend", request_id)
        return _operator_view(extended, intake.external_references([request_id]))

    @app.get("/api/v1/operator/requests/{request_id}/certificate",
             response_model=Certificate, response_class=JSONResponse, responses={
                 200: {"description": "the signed certificate as a JSON download (Content-Disposition: attachment),"
                                      " or with `format=html` as a page for people",
                       "content": {"text/html": {"schema": {"type": "string"}}},
                       "headers": {"Content-Disposition": {
                           "description": 'JSON only: attachment; filename="certificate-<request id>.json"',
                           "schema": {"type": "string"}}}},
                 **_refusals({404: _NO_REQUEST, 409: "the request is not completed yet"}, operator=True)})
    def certificate(who: Operator, request_id: RequestId, format: Literal["json", "html"] = "json") -> Response:
        """A completed request's signed certificate, exactly as signed (`dsr certificate --check` checks it)."""
        document = build_certificate(intake.ledger, request_id)
        audited(who, "certificate", request_id)
        if format == "html":
            return HTMLResponse(certificate_html(document))
        return JSONResponse(document, headers={
            "content-disposition": f'attachment; filename="certificate-{request_id}.json"'})

    @app.get("/api/v1/operator/runs", responses=_refusals({}, operator=True))
    def runs(who: Operator, limit: int = Query(10, ge=1, le=200)) -> models.RunList:
        """The last runs that did work, newest first."""
        found = models.RunList.model_validate({"runs": intake.ledger.runs(limit)})
        audited(who, "runs")
        return found

    @app.get("/api/v1/operator/tables", responses=_refusals({}, operator=True))
    def tables(who: Operator) -> models.TableTotals:
        """Per table, what every recorded run did there."""
        found = models.TableTotals.model_validate({"tables": intake.ledger.table_totals()})
        audited(who, "tables")
        return found

    @app.post("/api/v1/operator/ingest", responses=_refusals({}, operator=True))
    def ingest_now(who: Operator) -> models.Ingested:
        """Move acknowledged requests into the ledger now instead of at the next tick."""
        moved = models.Ingested(moved=intake.ingest())
        audited(who, "ingest")
        return moved

    @app.get("/api/v1/operator/holds", responses=_refusals({}, operator=True))
    def holds(who: Operator) -> models.HoldList:
        """Every legal hold, active, expired or released (a held subject is never shown, not even its hash)."""
        today = utc_now().date()
        found = models.HoldList(holds=[models.HoldRecord.of(h, today) for h in list_holds(intake.ledger)])
        audited(who, "holds")
        return found

    @app.post("/api/v1/operator/holds", status_code=201, responses=_refusals({
        422: f"{_SCHEMA}; or a `Refusal` naming `field`: not exactly one of subject_id and table, an unknown or "
             "shredded table, a day that is not a date or is in the past; nothing was written"}, operator=True))
    def place_hold(who: Operator, body: HoldBody) -> models.HoldRecord:
        """Place a legal hold (`dsr hold add`): runs leave the subject's erase requests `held`, or neither
        erase nor purge the table, until it is released or its last day has passed."""
        until = parse_until(body.until) if body.until is not None else None
        hold = add_hold(intake.ledger, body.reason, who, subject=body.subject_id, table=body.table, until=until)
        audited(who, "place hold")
        return models.HoldRecord.of(hold, utc_now().date())

    @app.post("/api/v1/operator/holds/{hold_id}/release", responses=_refusals({
        404: "no such hold", 409: "the hold was released already"}, operator=True))
    def release(who: Operator, hold_id: Annotated[str, Path(pattern=r"^hold-[0-9a-f]{16}$")]) -> models.HoldRecord:
        """Release a legal hold (`dsr hold release`): the next run resumes what it held."""
        hold = release_hold(intake.ledger, hold_id, who)
        audited(who, "release hold")
        return models.HoldRecord.of(hold, utc_now().date())

    # -- load balancers and monitoring (no rate limit, no credential, no identifier) ------------------
    @app.get("/healthz", responses=_responses({}))
    def health() -> models.Health:
        """The process answers."""
        return models.Health(ok=True)

    @app.get("/readyz", response_model=models.Readiness, response_class=JSONResponse, responses={
        **_responses({}), 503: {"model": models.Readiness, "description": "a part is not ready (`failing` names it): "
                                                                          "take this instance out of rotation"}})
    async def ready() -> Response:
        """Whether this instance can take and keep requests now: the queue takes a write, the ledger's
        catalog answers, the ingester process runs and is ready."""
        checks = await asyncio.to_thread(intake.readiness)
        failing = [part for part, ok in checks.items() if not ok]
        answer = models.Readiness.model_validate({"ready": not failing, "failing": failing, **checks})
        return JSONResponse(answer.model_dump(), status_code=503 if failing else 200)

    metrics = Metrics(intake, app.router.routes)

    # its refusals are JSON like every other's (a `model` here would be declared as text, the route's type)
    refusal = {"application/json": {"schema": {"$ref": "#/components/schemas/Refusal"}}}

    @app.get("/metrics", response_class=PlainTextResponse, responses={200: {
        "description": "the Prometheus text exposition format (prometheus_client); no label or value holds an "
                       "identifier", "content": {"text/plain": {"schema": {"type": "string"}}}},
        **{code: {"description": why, "content": refusal} for code, why in _EVERY_PATH.items()}})
    def metrics_text() -> PlainTextResponse:
        """Requests acknowledged, ingested and refused; the queue's depth and age; the ingester's lag and
        restarts; open requests by days left; HTTP latency by route."""
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def public(status: RequestStatus) -> models.RequestStatus:
        """What a person sees of their request: never the subject id (RequestStatus holds none)."""
        return models.RequestStatus.model_validate({
            "request_id": status.request_id, "type": status.request_type, "regulation": status.regulation,
            "status": status.status, "reason": status.status_reason, "received": status.received,
            "due_date": status.due_date, "days_left": status.days_left, "extended": status.extended,
            "completed": status.completed,
            "external_reference": intake.external_references([status.request_id]).get(status.request_id)})

    # -- pages --------------------------------------------------------------------------------------
    for path, page in (("/", "index.html"), ("/status", "status.html"), ("/dashboard", "dashboard.html")):
        app.add_api_route(path, _page(page), methods=["GET"], include_in_schema=False, response_class=HTMLResponse)
    app.mount("/static", StaticFiles(directory=str(PAGES / "static")), name="static")
    per_minute = settings.intake.rate_limit_per_minute
    return Guard(app, settings.intake.max_body_bytes, per_minute, metrics.observe,
                 limit=intake.queue.rate_limit(per_minute) if per_minute else None)


def _page(name: str):
    html = (PAGES / name).read_text(encoding="utf-8")

    def page() -> HTMLResponse:
        return HTMLResponse(html)

    return page


def _operator_view(status: RequestStatus, references: dict[str, ExternalReference]) -> models.OperatorRequest:
    """A request as operators see it (never its subject), with the other tool's id when it came from one."""
    return models.OperatorRequest.model_validate({**asdict(status),
                                                  "external_reference": references.get(status.request_id)})


def _errors(app: FastAPI) -> None:
    """Every refusal as `{"detail": ..., "field": ...}`; validation errors name the field and why,
    never the value sent (FastAPI's default echoes it)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{"field": _field(e), "message": _why(e)} for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(f"{p['field']}: {p['message']}" for p in problems),
                             "errors": problems}, status_code=422)

    @app.exception_handler(IntakeError)
    async def refused(_request: Request, exc: IntakeError) -> JSONResponse:
        headers = {"www-authenticate": "Bearer"} if exc.http_status == 401 else None
        return JSONResponse({"detail": str(exc), **({"field": exc.field} if exc.field else {})},
                            status_code=exc.http_status, headers=headers)

    @app.exception_handler(LedgerError)
    async def ledger_refused(_request: Request, exc: LedgerError) -> JSONResponse:
        unknown = "no request" in str(exc) or "no hold" in str(exc)
        return JSONResponse({"detail": str(exc)}, status_code=404 if unknown else 409)

    @app.exception_handler(RequestInputError)
    async def input_refused(_request: Request, exc: RequestInputError) -> JSONResponse:
        field, _, _ = str(exc).partition(":")  # the library's messages start with the field they refuse
        return JSONResponse({"detail": str(exc), "field": field}, status_code=422)

    @app.exception_handler(QueueUnavailableError)
    async def queue_down(_request: Request, exc: QueueUnavailableError) -> JSONResponse:
        log.warning("%s", exc)  # names the queue (no password); the answer does not: it is public
        return JSONResponse({"detail": "the intake queue cannot be reached now; nothing was acknowledged, try again"
                                       " later"}, status_code=503)

    @app.exception_handler(DsrError)
    async def engine_refused(_request: Request, exc: DsrError) -> JSONResponse:
        return JSONResponse({"detail": first_line(exc)}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's answer to a body json.loads cannot read (not UTF-8, nested too deep), its only 400
            # here: malformed JSON like any other, as the schema and the docs say
            problem = {"field": "body", "message": _MESSAGES["json_invalid"]}
            return JSONResponse({"detail": f"body: {problem['message']}", "errors": [problem]}, status_code=422)
        headers = exc.headers
        if exc.status_code == 405:
            # every method the path takes: Starlette names only those of the first route matching the path
            allowed = {method for route in request.app.router.routes if isinstance(route, Route)
                       and route.methods and route.matches(request.scope)[0] is not Match.NONE
                       for method in route.methods}
            headers = {"allow": ", ".join(sorted(allowed))} if allowed else headers
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def crashed(_request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error: %s", type(exc).__name__)  # the type only: a message may quote data
        return JSONResponse({"detail": "internal error; nothing was acknowledged"}, status_code=500)


_MESSAGES = {"json_invalid": "malformed JSON", "literal_error": "not one of the allowed values",
             "missing": "required", "extra_forbidden": "not an allowed field", "string_type": "must be a string",
             "string_too_short": "must not be empty", "string_too_long": "too long",
             "string_unicode": "is not valid Unicode text", "model_attributes_type": "must be a JSON object "
             "(sent as Content-Type: application/json)", "dict_type": "must be a JSON object"}


_PLAIN_NAME = re.compile(r"[A-Za-z_]{1,30}")


def _field(error: dict) -> str:
    """Where the problem is; a field name the client made up is shown only if it is a plain word
    (a name can be a misplaced identifier too)."""
    parts = [str(p) for p in error["loc"] if p != "body"]
    if error["type"] == "extra_forbidden" and parts and not _PLAIN_NAME.fullmatch(parts[-1]):
        parts[-1] = "(an unknown field)"
    return ".".join(parts) or "body"


def _why(error: dict) -> str:
    """pydantic's message without the input; the allowed values of a Literal are fine to show."""
    if error["type"] == "literal_error":
        return f"must be one of {error.get('ctx', {}).get('expected', '')}"
    return _MESSAGES.get(error["type"], error["type"].replace("_", " "))
