"""The intake service under load: `dsr serve` against many clients filing at once.

Usage: python bench/intake.py [--requests 10000] [--clients 20] [--retries 0.05] [--naive 200] [--ingest-interval 2]
                              [--instances 2 --queue postgresql]

A real `dsr serve` process on 127.0.0.1 (its own fresh catalog, no rate limit), and in this process
`--clients` keep-alive HTTP/1.1 connections, each filing its share of `--requests` one after the
other (bounded loops: no open-ended hammering). A fraction `--retries` of the filings is sent a
second time with the same Idempotency-Key, as a client does when an answer is lost: it must come
back with the same request id. Then the ledger is read: it must hold exactly the acknowledged
requests, each once. Reported: throughput, latency percentiles of every POST, and the seconds until
the last acknowledged request was in the ledger.

Several instances (`--instances 2 --queue postgresql`), measured in the same run after the single
one: a throwaway PostgreSQL server (Debian's `postgresql`, as in make test-integration) holds the queue
(`intake.queue_url`), that many `dsr serve` processes share it and the ledger, and the clients are
spread over them (client n files to instance n mod N). The same checks: every acknowledged request in
the ledger once (`lost`, `duplicated`). Reported beside the single instance on SQLite, with the ratio
of their throughputs.

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


async def load(port: int | list[int], total: int, clients: int, retry_share: float, seed: int) -> dict:
    """Every client files total/clients requests in a row (client n to `port`, or to the n-th of several,
    round robin); returns latencies and what was acknowledged."""
    ports = port if isinstance(port, list) else [port]
    rng = random.Random(seed)
    latencies: list[float] = []
    acknowledged: dict[str, str] = {}  # idempotency key -> request id
    replays = {"sent": 0, "same_id": 0}
    errors: list[int] = []

    async def client(n: int) -> None:
        connection = await Connection(ports[n % len(ports)]).open()
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


def configured(work: Path, ingest_interval: float = 2.0, queue_url: str | None = None) -> Path:
    """A fresh catalog and key under `work`, without a rate limit (one address files everything); the
    queue on `queue_url` (PostgreSQL) if given, else the SQLite file beside the key."""
    work.mkdir(parents=True)
    config = work / "dsr.yaml"
    config.write_text(yaml.safe_dump({
        "catalog": {"name": "bench", "properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
        "secret_key_file": str(work / "dsr-secret.key"),
        "intake": {"rate_limit_per_minute": 0, "ingest_interval_seconds": ingest_interval,
                   **({"queue_url": queue_url} if queue_url else {})}}))
    Ledger(load_settings(config)).ensure()
    return config


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _processes(roots: set[int] | None, name: str | None = None) -> list[int]:
    """The processes descending from `roots`, or (roots None) every process called `name`."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            names[int(entry.name)] = stat[stat.index("(") + 1:stat.rindex(")")]
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    if roots is None:
        return [pid for pid, comm in names.items() if comm == name]
    found, grew = set(roots), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return sorted(found & set(parents))


def cpu_used(roots: set[int]) -> dict[str, float]:
    """CPU seconds used so far by the servers' processes (HTTP), their ingester processes, PostgreSQL's
    processes and this one (the client)."""
    def total(pids: list[int]) -> float:
        seconds = 0.0
        for pid in pids:
            try:
                seconds += _cpu_seconds(pid)
            except (OSError, ValueError):  # ended meanwhile
                pass
        return seconds

    own = os.times()
    return {"servers": total(sorted(roots)), "ingesters": total([p for p in _processes(roots) if p not in roots]),
            "postgresql": total(_processes(None, "postgres")), "client": own.user + own.system}


def measure(config: Path, instances: int, a) -> dict:
    """`instances` servers on `config`, the load spread over them, then the ledger checked. Also the CPU
    time each part used per filing during the load (servers, their ingesters, PostgreSQL, the client): on
    a machine with few cores, what bounds the throughput."""
    served = [serve(config) for _ in range(instances)]
    try:
        before = cpu_used({proc.pid for proc, _ in served})
        result = asyncio.run(load([port for _, port in served], a.requests, a.clients, a.retries, seed=7))
        after = cpu_used({proc.pid for proc, _ in served})
        result["cpu_ms_per_filing"] = {part: round((after[part] - before[part]) * 1000 / result["posts"], 3)
                                       for part in after}
        result["cores"] = os.cpu_count()
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
        for proc, _ in served:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in served:
            proc.wait(timeout=60)
    result.update(acknowledged=len(acknowledged), in_ledger=len(set(ids)), lost=len(acknowledged - set(ids)),
                  duplicated=len(ids) - len(set(ids)), unexpected=len(set(ids) - acknowledged))
    return result


def run(work: Path, a) -> dict:
    found = {"service": measure(configured(work / "service", a.ingest_interval), 1, a)}
    if a.queue == "postgresql":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from integration.servers import postgres  # the integration tests' throwaway server

        with postgres() as pg:
            url = f"postgresql://{pg.user}:{pg.password}@127.0.0.1:{pg.port}/{pg.database}"
            several = measure(configured(work / "instances", a.ingest_interval, url), a.instances, a)
        found["instances"] = {"instances": a.instances, "queue": "postgresql", **several}
        found["instances_throughput_ratio"] = round(several["throughput_per_s"] /
                                                    found["service"]["throughput_per_s"], 2)
    if a.naive:
        found["naive"] = naive(configured(work / "naive"), a.naive, a.clients)
    return found


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["p50_ms", "p90_ms", "p99_ms", "max_ms"]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    groups = [("dsr serve (SQLite queue, group commits)", "service")]
    if "instances" in result:
        groups.append((f"{result['instances']['instances']} × dsr serve, PostgreSQL queue", "instances"))
    groups += [("commit per request (naive)", "naive")] if "naive" in result else []
    width = 0.8 / len(groups)
    for k, (label, key) in enumerate(groups):
        values = [result[key]["latency"][n] for n in names]
        ax.bar([i + (k - (len(groups) - 1) / 2) * width for i in range(len(names))], values, width, label=label)
    ax.axhline(100, color="red", linestyle="--", linewidth=1, label="100 ms target (p99)")
    ax.set_xticks(range(len(names)), [n.removesuffix("_ms") for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("latency of one filing, ms (log)")
    s = result["service"]
    more = result.get("instances")
    several = f", {more['instances']} instances (PostgreSQL) {more['throughput_per_s']}/s" if more else ""
    naive = f" vs {result['naive']['throughput_per_s']}/s naive" if "naive" in result else ""
    ax.set_title(f"{s['posts']} filings, {result['clients']} clients: {s['throughput_per_s']}/s{several}{naive}",
                 fontsize=9)
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
    parser.add_argument("--instances", type=int, default=1, help="with --queue postgresql: servers sharing it")
    parser.add_argument("--queue", choices=("sqlite", "postgresql"), default="sqlite",
                        help="postgresql: also measure --instances servers on a PostgreSQL queue")
    a = parser.parse_args()
    out = Path("bench/results/intake.json")
    previous = json.loads(out.read_text()) if out.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp), a)
    if "naive" not in result and "naive" in previous:  # --naive 0: the last measured naive figures stay
        result["naive"] = previous["naive"]
    result.update(requests=a.requests, clients=a.clients, at=datetime.now(UTC).isoformat(timespec="seconds"))
    if "naive" in result:
        result["throughput_ratio"] = round(result["service"]["throughput_per_s"] /
                                           result["naive"]["throughput_per_s"], 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    chart(result, out.with_suffix(".png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
