"""`dsr serve` driven by its own OpenAPI document (issue 55): schemathesis (on hypothesis) draws requests
from `/api/v1/openapi.json`, ones the schema allows and ones it forbids, for every operation, sends them
to a real server and checks every answer: no 5xx; only the status codes the operation documents, with
the documented body, content type and headers; a forbidden request refused, an allowed one accepted
(api_fuzz_checks.py says which refusals no schema can state); a missing required header refused; a
method a path does not take answered 405 with `Allow` naming the ones it does. The server verifies
identities by e-mail (the filing's schema then requires an address), and every request carries an
operator's token, so operator calls get past the credential check (401s are test_operators.py's).
Settings: api_fuzz.toml. About a minute.

Run: `.venv/bin/python -m pytest -q -m integration tests/integration/test_api_fuzz.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from intake_server import OPERATOR_TOKEN, Mailbox, intake_config, served
from lakehouse_dsr.config import load_settings

HERE = Path(__file__).parent
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"


def test_the_service_keeps_its_documented_contract(tmp_path):
    mailbox = Mailbox().start()
    try:
        config = intake_config(tmp_path, verification="email_code", rate_limit_per_minute=0,
                               smtp={"host": "127.0.0.1", "port": mailbox.port})
        env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HERE / "api_fuzz_checks.py"),
               "DSR_MAX_BODY_BYTES": str(load_settings(config).intake.max_body_bytes)}
        with served(config) as server:
            run = subprocess.run(
                [str(SCHEMATHESIS), "--config-file", str(HERE / "api_fuzz.toml"), "run", "--no-color",
                 "--header", f"Authorization: Bearer {OPERATOR_TOKEN}", "--report-dir", str(tmp_path / "report"),
                 f"{server.url}/api/v1/openapi.json"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # its cache: this run's
            log = server.output()
    finally:
        mailbox.stop()
    assert run.returncode == 0, f"{run.stdout[-20_000:]}\n{run.stderr[-2_000:]}\nserver log:\n{log[-5_000:]}"
    assert "internal error" not in log  # the service logs each 500 it sends (by type)
