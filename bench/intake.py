"""The intake service under load: `dsr serve` against many clients filing at once.

Usage: python bench/intake.py [--requests 10000] [--clients 20] [--retries 0.05] [--naive 200] [--ingest-interval 2]

A real `dsr serve` process on 127.0.0.1 (its own fresh catalog, no rate limit), and in this process
`--clients` keep-alive HTTP/1.1 connections, each filing its share of `--requests` one after the
other (bounded loops: no open-ended hammering). A fraction `--retries` of the filings is sent a
second time with the same Idempotency-Key, as a client does when an answer is lost: it must come
back with the same request id. Then the ledger is read: it must hold exactly the acknowledged
requests, each once. Reported: throughput, latency percentiles of every POST, and the seconds until
the last acknowledged request was in the ledger.

The naive way, measured in the same run: a service without the durable queue commits each request
to the ledger while the client waits (`Ledger.submit` per request, `--clients` threads at once,
`--naive` requests in all). JSON to bench/results/intake.json, a chart to intake.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import yaml

from lakehouse_dsr.config import load_settings
from lakehouse_dsr.exceptions import LedgerError
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput

TOKEN = "bench-operator-token"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 2),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 2)}


class Connection:
    """One keep-alive HTTP/1.1 connection, written by hand: the client must cost less than the server."""

    def __init__(self, port: int):
        self.port = port

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self, path: str, payload: dict, key: str) -> tuple[int, dict]:
        body = json.dumps(payload).encode()
        self.writer.write((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           f"Idempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        await self.writer.drain()
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, json.loads(await self.reader.readexactly(length))


async def load(port: int, total: int, clients: int, retry_share: float, seed: int) -> dict:
    """Every client files total/clients requests in a row; returns latencies and what was acknowledged."""
    rng = random.Random(seed)
    latencies: list[float] = []
    acknowledged: dict[str, str] = {}  # idempotency key -> request id
    replays = {"sent": 0, "same_id": 0}
    errors: list[int] = []

    async def client(n: int) -> None:
        connection = await Connection(port).open()
        for i in range(total // clients + (1 if n < total % clients else 0)):
            key, subject = str(uuid.UUID(int=rng.getrandbits(128))), f"bench-{n}-{i}"
            payload = {"type": "erase" if i % 3 else "access", "subject_id": subject,
                       "regulation": "ccpa" if i % 2 else "gdpr"}
            for attempt in range(2 if rng.random() < retry_share else 1):
                start = time.perf_counter()
                status, answer = await connection.post("/api/v1/requests", payload, key)
                latencies.append(time.perf_counter() - start)
                if status != 202:
                    errors.append(status)
                    continue
                if attempt:
                    replays["sent"] += 1
                    replays["same_id"] += answer["request_id"] == acknowledged[key] and answer["replayed"]
                else:
                    acknowledged[key] = answer["request_id"]
        connection.writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "posts": len(latencies), "throughput_per_s": round(len(latencies) / seconds),
            "latency": percentiles(latencies), "errors": len(errors), "replays": replays,
            "acknowledged": acknowledged}


def naive(config: Path, total: int, clients: int) -> dict:
    """Each request committed to the ledger while its client waits, `clients` at a time."""
    ledger = Ledger(load_settings(config))

    def one(i: int) -> tuple[float, bool]:
        start = time.perf_counter()
        try:
            ledger.submit([RequestInput(f"naive-{i}", "erase")])
        except LedgerError:  # lost the commit race every time: the client gets an error, nothing is kept
            return time.perf_counter() - start, False
        return time.perf_counter() - start, True

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        outcomes = list(pool.map(one, range(total)))
    seconds = time.perf_counter() - start
    kept = sum(ok for _, ok in outcomes)
    return {"requests": total, "seconds": round(seconds, 3), "throughput_per_s": round(kept / seconds, 1),
            "refused": total - kept, "latency": percentiles([latency for latency, _ in outcomes])}


def serve(config: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsr = str(Path(sys.executable).parent / "dsr")
    proc = subprocess.Popen([dsr, "-c", str(config), "serve", "--port", str(port)], cwd=config.parent,
                            env={**os.environ, "DSR_API_TOKEN": TOKEN}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, port
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("dsr serve did not start")


def configured(work: Path, ingest_interval: float = 2.0) -> Path:
    """A fresh catalog and key under `work`, without a rate limit (one address files everything)."""
    work.mkdir(parents=True)
    config = work / "dsr.yaml"
    config.write_text(yaml.safe_dump({
        "catalog": {"name": "bench", "properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
        "secret_key_file": str(work / "dsr-secret.key"),
        "intake": {"rate_limit_per_minute": 0, "ingest_interval_seconds": ingest_interval}}))
    Ledger(load_settings(config)).ensure()
    return config


def run(work: Path, a) -> dict:
    config = configured(work / "service", a.ingest_interval)
    proc, port = serve(config)
    try:
        result = asyncio.run(load(port, a.requests, a.clients, a.retries, seed=7))
        done_at = time.perf_counter()
        acknowledged = set(result.pop("acknowledged").values())
        ledger = Ledger(load_settings(config))
        while True:  # the service's own ingest, not a forced one: what a user waits for
            ids = [r["request_id"] for r in ledger.store.rows("requests", None, ("request_id",))]
            if set(ids) >= acknowledged or time.perf_counter() - done_at > 300:
                break
            time.sleep(0.5)
        result["seconds_until_in_ledger"] = round(time.perf_counter() - done_at, 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    result.update(acknowledged=len(acknowledged), in_ledger=len(set(ids)), lost=len(acknowledged - set(ids)),
                  duplicated=len(ids) - len(set(ids)), unexpected=len(set(ids) - acknowledged))
    return {"service": result, "naive": naive(configured(work / "naive"), a.naive, a.clients)}


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["p50_ms", "p90_ms", "p99_ms", "max_ms"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for offset, (label, key) in zip((-width / 2, width / 2), (("dsr serve (queue, group commits)", "service"),
                                                               ("commit per request (naive)", "naive")), strict=True):
        values = [result[key]["latency"][n] for n in names]
        ax.bar([i + offset for i in range(len(names))], values, width, label=label)
    ax.axhline(100, color="red", linestyle="--", linewidth=1, label="100 ms target (p99)")
    ax.set_xticks(range(len(names)), [n.removesuffix("_ms") for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("latency of one filing, ms (log)")
    s = result["service"]
    ax.set_title(f"{s['posts']} filings, {result['clients']} clients: {s['throughput_per_s']}/s "
                 f"vs {result['naive']['throughput_per_s']}/s naive")
    ax.legend(fontsize=8, loc="center left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--retries", type=float, default=0.05)
    parser.add_argument("--naive", type=int, default=200)
    parser.add_argument("--ingest-interval", type=float, default=2.0, help="intake.ingest_interval_seconds")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp), a)
    result.update(requests=a.requests, clients=a.clients, at=datetime.now(UTC).isoformat(timespec="seconds"),
                  throughput_ratio=round(result["service"]["throughput_per_s"] / result["naive"]["throughput_per_s"],
                                         1))
    out = Path("bench/results/intake.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    chart(result, out.with_suffix(".png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
