"""Run the intake service under uvicorn: what `dsr serve` calls, usable from a script as well."""

from __future__ import annotations

import logging

import uvicorn

from ..config import Settings
from .app import create_app


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8080, forwarded_allow_ips: str | None = None
          ) -> None:
    """Serve until interrupted. Behind a reverse proxy, `forwarded_allow_ips` names the proxy's
    addresses whose X-Forwarded-For is believed (the rate limit counts the real client then);
    default: uvicorn's ($FORWARDED_ALLOW_IPS, else 127.0.0.1). One process: the rate limit and the
    group commits live in it; more processes may share the queue file and the ledger."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=host, port=port, proxy_headers=True,
                forwarded_allow_ips=forwarded_allow_ips, server_header=False, log_level="info",
                access_log=False)  # an access log line holds paths with request ids and tokens: kept out
