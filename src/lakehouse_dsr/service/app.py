"""`dsr serve`: the HTTP intake service (FastAPI on uvicorn), a thin shell over intake.py and the ledger.

People file requests and follow them (`/api/v1/requests`, the pages `/` and `/status`); operators,
holding `$DSR_API_TOKEN`, list and extend requests, read runs and download certificates
(`/api/v1/operator/...`, the page `/dashboard`). No answer ever holds a subject identifier: error
messages name the field, never its value, and no stack trace leaves the process.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib import resources
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import Settings
from ..evidence.certificate import build_certificate, certificate_html
from ..exceptions import DsrError, LedgerError, first_line
from ..ledger.ledger import RequestStatus
from ..ledger.requests import REQUEST_ID
from .guard import Guard
from .intake import Filing, Intake, IntakeError

TOKEN_ENV = "DSR_API_TOKEN"
log = logging.getLogger("lakehouse_dsr.service")
PAGES = resources.files("lakehouse_dsr.service") / "pages"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FilingBody(_Body):
    type: Literal["erase", "access", "opt_out", "opt_in"]
    subject_id: str = Field(min_length=1)
    regulation: Literal["gdpr", "ccpa"] = "gdpr"
    email: str | None = None


class CodeBody(_Body):
    code: str


class ExtendBody(_Body):
    reason: str = Field(min_length=1, max_length=2000)


def _request_id(request_id: str) -> str:
    if not REQUEST_ID.fullmatch(request_id):
        raise IntakeError("no such request", 404)
    return request_id


RequestId = Annotated[str, Depends(_request_id)]


def create_app(settings: Settings, intake: Intake | None = None, operator_token: str | None = None) -> Guard:
    """The service as an ASGI application. `intake` defaults to one on `settings`' ledger and queue,
    started with the application; `operator_token` to `$DSR_API_TOKEN` (unset: no operator access)."""
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
    if settings.intake.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.intake.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Idempotency-Key", "X-Status-Token", "Authorization"])
    _errors(app)

    def operator(authorization: Annotated[str | None, Header()] = None) -> None:
        if not token:
            raise IntakeError(f"operator access is off: the server has no ${TOKEN_ENV}", 401)
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise IntakeError("a valid operator bearer token is required", 401)

    Operator = Depends(operator)

    # -- the person's side --------------------------------------------------------------------------
    @app.post("/api/v1/requests", status_code=202)
    async def file_request(body: FilingBody, idempotency_key: Annotated[str | None, Header()] = None,
                           sec_gpc: Annotated[str | None, Header()] = None) -> dict:
        filing = Filing(body.type, body.subject_id, body.regulation, body.email)
        ack = await asyncio.wrap_future(intake.file(filing, idempotency_key, gpc=(sec_gpc or "").strip() == "1"))
        return {k: v for k, v in asdict(ack).items() if v is not None}

    @app.get("/api/v1/requests/{request_id}")
    def request_status(request_id: RequestId, status_token: str | None = None,
                       x_status_token: Annotated[str | None, Header()] = None) -> dict:
        return _public(intake.status(request_id, x_status_token or status_token))

    @app.post("/api/v1/requests/{request_id}/verify")
    def verify(request_id: RequestId, body: CodeBody) -> dict:
        return _public(intake.verify(request_id, body.code))

    @app.post("/api/v1/requests/{request_id}/code", status_code=202)
    def resend_code(request_id: RequestId, status_token: str | None = None,
                    x_status_token: Annotated[str | None, Header()] = None) -> dict:
        return _public(intake.resend_code(request_id, x_status_token or status_token))

    # -- the operator's side ------------------------------------------------------------------------
    @app.get("/api/v1/operator/requests", dependencies=[Operator])
    def list_requests(status: str | None = Query(None, max_length=40), type: str | None = Query(None, max_length=40),
                      regulation: str | None = Query(None, max_length=40)) -> dict:
        found = intake.requests(status, type, regulation)
        return {"count": len(found), "requests": [asdict(r) for r in found]}

    @app.post("/api/v1/operator/requests/{request_id}/extend", dependencies=[Operator])
    def extend(request_id: RequestId, body: ExtendBody) -> dict:
        return asdict(intake.ledger.extend(request_id, body.reason))

    @app.get("/api/v1/operator/requests/{request_id}/certificate", dependencies=[Operator])
    def certificate(request_id: RequestId, format: Literal["json", "html"] = "json") -> Response:
        document = build_certificate(intake.ledger, request_id)
        if format == "html":
            return HTMLResponse(certificate_html(document))
        return JSONResponse(document, headers={
            "content-disposition": f'attachment; filename="certificate-{request_id}.json"'})

    @app.get("/api/v1/operator/runs", dependencies=[Operator])
    def runs(limit: int = Query(10, ge=1, le=200)) -> dict:
        return {"runs": intake.ledger.runs(limit)}

    @app.get("/api/v1/operator/tables", dependencies=[Operator])
    def tables() -> dict:
        return {"tables": intake.ledger.table_totals()}

    @app.post("/api/v1/operator/ingest", dependencies=[Operator])
    def ingest_now() -> dict:
        """Move acknowledged requests into the ledger now instead of at the next tick."""
        return {"moved": intake.ingest()}

    @app.get("/healthz")
    def health() -> dict:
        return {"ok": True}

    # -- pages --------------------------------------------------------------------------------------
    for path, page in (("/", "index.html"), ("/status", "status.html"), ("/dashboard", "dashboard.html")):
        app.add_api_route(path, _page(page), methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=str(PAGES / "static")), name="static")
    return Guard(app, settings.intake.max_body_bytes, settings.intake.rate_limit_per_minute)


def _page(name: str):
    html = (PAGES / name).read_text(encoding="utf-8")

    def page() -> HTMLResponse:
        return HTMLResponse(html)

    return page


def _public(status: RequestStatus) -> dict:
    """What a person sees of their request: never the subject id (RequestStatus holds none)."""
    return {"request_id": status.request_id, "type": status.request_type, "regulation": status.regulation,
            "status": status.status, "reason": status.status_reason, "received": status.received,
            "due_date": status.due_date, "days_left": status.days_left, "extended": status.extended,
            "completed": status.completed}


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
        return JSONResponse({"detail": str(exc)}, status_code=404 if "no request" in str(exc) else 409)

    @app.exception_handler(DsrError)
    async def engine_refused(_request: Request, exc: DsrError) -> JSONResponse:
        return JSONResponse({"detail": first_line(exc)}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

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
