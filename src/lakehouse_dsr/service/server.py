"""Run the intake service under uvicorn: what `dsr serve` calls, usable from a script as well.

Stopping: SIGTERM or SIGINT, to the server alone or to its whole process group (systemd's default
KillMode=control-group signals every process), stops it cleanly within `STOP_SECONDS`: no new
connection is taken, requests in flight are answered (for at most `GRACE_SECONDS`), the ingester
finishes its batch and what else it can move within a few seconds, the queue's last group commit is
written and the file closed, and every process exits 0 with no traceback.
"""

from __future__ import annotations

import gc
import logging
import signal
from types import FrameType

import uvicorn

from ..config import Settings
from .app import create_app
from .intake import CLOSE_SECONDS

GRACE_SECONDS = 3  # requests in flight when a stop signal comes are answered within this
STOP_SECONDS = GRACE_SECONDS + CLOSE_SECONDS  # then the ingester and the queue stop


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8080, forwarded_allow_ips: str | None = None
          ) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly (see the module). Behind a reverse proxy,
    `forwarded_allow_ips` names the proxy's addresses whose X-Forwarded-For is believed (the rate
    limit counts the real client then); default: uvicorn's ($FORWARDED_ALLOW_IPS, else 127.0.0.1).
    One process: the rate limit and the group commits live in it; more processes may share the
    queue file and the ledger."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # uvicorn takes SIGTERM and SIGINT while it runs; once it has shut down it raises the signal again
    # against the handlers it found, to die of it (exit 143, or a KeyboardInterrupt traceback). The stop
    # asked for is done by then, so the handlers it finds end the process with 0; before uvicorn takes
    # over (the application being built), they end it at once, with 0 too: nothing was started yet.
    previous = {number: signal.signal(number, _exit_cleanly) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        app = create_app(settings)
        # What start-up made lives as long as the process: out of the collector's reach, a full
        # collection walks only what requests make, and pauses in answers get shorter.
        gc.collect()
        gc.freeze()
        uvicorn.run(app, host=host, port=port, proxy_headers=True,
                    forwarded_allow_ips=forwarded_allow_ips, server_header=False, log_level="info",
                    timeout_graceful_shutdown=GRACE_SECONDS,
                    access_log=False)  # an access log line holds paths with request ids and tokens: kept out
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _exit_cleanly(_signal: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)
