"""Checking the intake service's answers against its own OpenAPI document with an independent
validator (jsonschema, JSON Schema 2020-12 as OpenAPI 3.1 uses it), and a client that drives the
application in this process and checks every answer it gets."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime

import httpx
from jsonschema import Draft202012Validator, FormatChecker

FORMATS = FormatChecker()  # "date" is built in; "date-time" needs a package jsonschema does not require


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if isinstance(value, str):
        datetime.fromisoformat(value)
    return True


class OpenAPI:
    """An OpenAPI document: the schema of each declared answer, `$ref`s resolved against its components."""

    def __init__(self, spec: dict):
        self.spec = spec
        self._templates = [(re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", path) + "$"), path)
                           for path in spec["paths"]]

    def template(self, url_path: str) -> str | None:
        """The documented path (`/api/v1/requests/{request_id}`) a concrete path belongs to."""
        found = [template for pattern, template in self._templates if pattern.match(url_path)]
        return found[0] if found else None

    def schema(self, path: str, method: str, status: int | str, media: str = "application/json") -> dict:
        responses = self.spec["paths"][path][method.lower()]["responses"]
        assert str(status) in responses, f"{method.upper()} {path} answered {status}, which it does not declare"
        content = responses[str(status)].get("content", {})
        assert media in content, f"{method.upper()} {path} {status}: no {media} declared (only {sorted(content)})"
        return content[media]["schema"]

    def validator(self, schema: dict) -> Draft202012Validator:
        """`schema` as the root of a document holding the components: its `#/components/...` refs resolve."""
        root = {**schema, "components": self.spec["components"]}
        Draft202012Validator.check_schema(root)
        return Draft202012Validator(root, format_checker=FORMATS)

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            ref = schema["$ref"]
            assert ref.startswith("#/components/schemas/"), ref
            schema = self.spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        return schema

    def check(self, method: str, response: httpx.Response) -> tuple[str, str, int]:
        """Validate an answer against what its operation declares for its status (an undeclared status
        fails too). Returns (path template, method, status)."""
        path = self.template(response.request.url.path)
        assert path is not None, f"{response.request.url.path} is not in the OpenAPI document"
        media = response.headers["content-type"].split(";")[0].strip()
        schema = self.schema(path, method, response.status_code, media)
        if media == "application/json":
            self.validator(schema).validate(response.json())
        return path, method.lower(), response.status_code


class CheckedClient:
    """Drives an ASGI application in this process (httpx's ASGI transport, no server) and checks every
    answer from an API path against `openapi`; `seen` collects (path template, method, status)."""

    def __init__(self, app, openapi: OpenAPI, headers: dict[str, str] | None = None):
        self.openapi, self.seen = openapi, set()
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                         headers=headers)

    def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        response = self._loop.run_until_complete(self._client.request(method, url, **kwargs))
        path = response.request.url.path
        if (path.startswith("/api/") or path in ("/healthz", "/readyz", "/metrics")) and path != "/api/v1/openapi.json":
            self.seen.add(self.openapi.check(method, response))
        return response

    def get(self, url: str, **kwargs) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def close(self) -> None:
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()
