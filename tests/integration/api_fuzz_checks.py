"""A schemathesis check for tests/integration/test_api_fuzz.py (`schemathesis run` loads this file through
SCHEMATHESIS_HOOKS): a request the OpenAPI document allows is accepted, or refused only for what it names
(401, 403, 404, 409: an unknown id, a wrong token, a state) or for what no JSON Schema can state: a body
over `intake.max_body_bytes` (413; its size in bytes, from DSR_MAX_BODY_BYTES), and the 422 refusals
below, which depend on the day of the request or on the data map (whose table names the public document
does not publish)."""

from __future__ import annotations

import os
import re

import schemathesis

ANSWERED = {401, 403, 404, 409, 429}  # the built-in positive_data_acceptance's, which this check replaces
# per operation: the `field` of a 422 `Refusal` the schema cannot foresee
UNFORESEEABLE = {("POST", "/api/v1/operator/holds"): re.compile(r"until|table"),
                 ("POST", "/api/v1/operator/requests/batch"): re.compile(r"requests\.\d+\.received_at")}


@schemathesis.check
def allowed_is_accepted(ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
                        ) -> None:
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    status = response.status_code
    if status < 400 or status in ANSWERED or status >= 500:  # a 5xx is not_a_server_error's to report
        return
    body = response.request.body or b""
    size = len(body.encode() if isinstance(body, str) else body)
    if status == 413 and size > int(os.environ["DSR_MAX_BODY_BYTES"]):
        return
    pattern = UNFORESEEABLE.get((case.method.upper(), case.operation.path))
    if status == 422 and pattern is not None and pattern.fullmatch(response.json().get("field", "")):
        return
    raise AssertionError(f"a request the OpenAPI document allows was refused with {status}: {response.text[:500]}")
