"""The intake service as tests meet it: `dsr serve` in its own process on a free port, a real SMTP
server (aiosmtpd) collecting what it is sent, and a config on a fresh catalog."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from email import message_from_bytes
from pathlib import Path

import httpx
from aiosmtpd.controller import Controller

from helpers import make_settings, write_config

OPERATOR_TOKEN = "operator-token-for-tests-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def intake_config(root: Path, **intake) -> Path:
    """A dsr.yaml under `root` (its own catalog, key and queue) with `intake:` settings."""
    root.mkdir(parents=True, exist_ok=True)
    settings = make_settings(root)
    return write_config(settings, root / "dsr.yaml", intake={"ingest_interval_seconds": 0.5, **intake})


class Served:
    """`dsr serve` on 127.0.0.1:<free port>; `kill()` is SIGKILL, `stop()` a clean shutdown."""

    def __init__(self, config: Path, env: dict[str, str] | None = None, token: str | None = OPERATOR_TOKEN,
                 wait: bool = True):
        self.config, self.port = config, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environment = {**os.environ, **(env or {})}
        environment.pop("DSR_API_TOKEN", None)
        if token:
            environment["DSR_API_TOKEN"] = token
        dsr = str(Path(sys.executable).parent / "dsr")
        self.log = config.parent / f"serve-{self.port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([dsr, "-c", str(config), "serve", "--port", str(self.port)],
                                         cwd=config.parent, env=environment, stdout=out, stderr=subprocess.STDOUT)
        if wait:
            self._wait_ready()

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"dsr serve exited {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.kill()
        raise AssertionError(f"dsr serve did not answer within {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, **kwargs)

    def operator(self) -> httpx.Client:
        return self.client(headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def served(config: Path, **kwargs):
    server = Served(config, **kwargs)
    try:
        yield server
    finally:
        server.stop()


class Mailbox:
    """A real SMTP server on a free port; `messages` holds what arrived."""

    def __init__(self, port: int | None = None):
        self.messages: list = []
        self.port = port or free_port()
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, _server, _session, envelope):  # aiosmtpd's handler hook
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"

    def start(self) -> Mailbox:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def code_for(self, request_id: str, timeout: float = 15) -> str:
        """The last code mailed for `request_id`, waiting for it to arrive."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in reversed(self.messages):
                if request_id in message["Subject"]:
                    return re.search(r"^ +(\d{6})\s*$", message.get_payload(), re.M).group(1)
            time.sleep(0.05)
        raise AssertionError(f"no code was mailed for {request_id} within {timeout} s")
