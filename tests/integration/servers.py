"""Throwaway servers on 127.0.0.1 for the integration tests: SeaweedFS (S3 + Iceberg REST), PostgreSQL,
a Spark standalone master with workers. Each is a context manager that stops what it started."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(ready: Callable[[], bool], proc: subprocess.Popen, what: str, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError):
            if ready():
                return
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL after 20 s: nothing the test started outlives it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def _process(args: list[str], log: Path, env: dict[str, str] | None = None, user: str | None = None
             ) -> Iterator[subprocess.Popen]:
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                user=user)
    try:
        yield proc
    finally:
        _stop(proc)


@dataclass(frozen=True)
class SeaweedFS:
    s3_port: int
    iceberg_port: int
    access_key: str
    secret_key: str
    bucket: str = "warehouse"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def catalog_uri(self) -> str:
        return f"http://127.0.0.1:{self.iceberg_port}"


@contextlib.contextmanager
def seaweedfs(root: Path) -> Iterator[SeaweedFS]:
    """`weed mini`: master, volume, filer, S3 and the Iceberg REST catalog, every port chosen here."""
    server = SeaweedFS(free_port(), free_port(), "dsr-test-key", "dsr-test-secret-0123456789")
    data = root / "seaweed"
    data.mkdir()
    ports = {name: free_port() for name in ("master", "volume", "filer", "admin", "debug")}
    args = [
        str(BIN / "weed"), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-s3.port={server.s3_port}", f"-s3.port.iceberg={server.iceberg_port}", "-s3.port.lance=0",
        f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
        f"-admin.port={ports['admin']}", f"-debug.port={ports['debug']}", "-admin.ui=false", "-webdav=false",
        "-master.telemetry=false", f"-tableBucket={server.bucket}",
    ]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
    log = root / "seaweed.log"
    with _process(args, log, env) as proc:

        def ready() -> bool:
            with urllib.request.urlopen(f"{server.catalog_uri}/v1/config", timeout=2):
                return _listening(server.s3_port)

        _wait(ready, proc, "weed mini", log)
        yield server


@dataclass(frozen=True)
class Postgres:
    port: int
    user: str = "dsr"
    password: str = "dsr-test-password"
    database: str = "catalog"

    @property
    def jdbc_uri(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/{self.database}"

    @property
    def sqlalchemy_uri(self) -> str:
        return f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"


def _pg_bin() -> Path:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed: make integration-deps installs the Debian package")
    return versions[-1].parent


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL cluster (initdb), run as user postgres when we are root (it refuses root).

    Its folder is a fresh temporary one: pytest's own folders are private to root."""
    server = Postgres(free_port())
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="dsr-pg-"))
    try:
        if user:
            os.chown(root, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
        with _postgres_in(root, server, user):
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _postgres_in(root: Path, server: Postgres, user: str | None) -> Iterator[None]:
    data = root / "pgdata"
    secret = root / "pgpass"
    log = root / "postgres.log"
    for path, content in ((secret, server.password + "\n"), (log, "")):
        path.write_text(content)
        if user:
            os.chown(path, pwd.getpwnam(user).pw_uid, -1)
    init = subprocess.run(
        [str(_pg_bin() / "initdb"), "-D", str(data), "-U", server.user, "--auth=scram-sha-256",
         f"--pwfile={secret}", "-E", "UTF8", "--locale=C.UTF-8"],
        capture_output=True, text=True, user=user, cwd=root,
    )
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr[-2000:]}")
    args = [str(_pg_bin() / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(server.port),
            "-k", str(root)]
    with _process(args, log, user=user) as proc:
        _wait(lambda: _listening(server.port), proc, "postgres", log)
        subprocess.run([str(_pg_bin() / "createdb"), "-h", "127.0.0.1", "-p", str(server.port), "-U", server.user,
                        server.database], check=True, capture_output=True,
                       env={**os.environ, "PGPASSWORD": server.password})
        yield


@dataclass(frozen=True)
class SparkCluster:
    port: int

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"


@contextlib.contextmanager
def spark_cluster(root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Iterator[SparkCluster]:
    """A standalone master and `workers` workers, started with pyspark's own `spark-class`."""
    spark_home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_WORKER_DIR": str(root / "work"), "SPARK_LOG_DIR": str(root), "PYSPARK_PYTHON": sys.executable}
    spark_class = str(spark_home / "bin" / "spark-class")
    cluster = SparkCluster(free_port())
    log = root / "master.log"
    try:
        with contextlib.ExitStack() as stack:
            master = stack.enter_context(_process(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                 str(cluster.port), "--webui-port", str(free_port())], log, env))
            _wait(lambda: "I have been elected leader" in log.read_text(errors="replace"), master, "spark master", log)
            for i in range(workers):
                stack.enter_context(_process(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores",
                     str(cores), "--memory", memory, "--webui-port", str(free_port()), cluster.master_url],
                    root / f"worker{i}.log", env))
            _wait(lambda: log.read_text(errors="replace").count("Registering worker") >= workers, master,
                  "spark workers", log)
            yield cluster
    finally:  # executors' copies of every jar (~240 MB per application), once every process has stopped
        shutil.rmtree(root / "work", ignore_errors=True)
