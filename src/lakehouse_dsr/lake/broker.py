"""A throwaway Apache Kafka broker on 127.0.0.1, for tests and benchmarks: Kafka 4.1 in KRaft mode,
broker and controller in one JVM, from Maven Central's jars (lake/jars.py's kafka-broker list:
`dsr fetch-jars --kafka-broker`), with no Docker and no Kafka installation.

    with LocalBroker() as broker:
        AdminClient({"bootstrap.servers": broker.bootstrap})...

What it costs: the jars' download once per machine (~43 MB, then from ~/.cache/lakehouse-dsr/jars/
kafka-broker); each start three JVMs, the storage tool's twice (a cluster id, then the format: ~0.7 s
each) then the broker's, answering 4-7 s after start() is called on 2 cores (more while they are
busy), ~320 MB of memory while it runs; stop() takes ~0.5 s. Its data, configuration and log live in
a temporary folder that stop() removes.

Tuned for tests: one node, replication factors 1, no automatic topic creation, no delay before a
consumer group's first rebalance, and retention and compaction checked every second (topics set
`retention.ms`, `segment.ms`, `min.cleanable.dirty.ratio`, `delete.retention.ms` small for them to
happen within seconds).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ..exceptions import EnvironmentSetupError
from . import jars
from .jvm import java_binary

START_TIMEOUT = 60.0  # seconds for the broker to answer after its JVM starts
STOP_TIMEOUT = 15.0  # seconds for a clean shutdown (SIGTERM) before SIGKILL
_LOG_TAIL_CHARS = 4000

# Broker logs at WARN to its log file (the JVM's stdout), and the line saying it started: enough to
# tell why a start failed without the INFO chatter of every partition and segment.
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick; another process could take it before use)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_properties(data: Path, port: int, controller_port: int) -> str:
    """server.properties of a one-node KRaft cluster (broker and controller in one process) listening
    on 127.0.0.1 only, its log segments under `data`."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        # formatted with --standalone, which refuses the static controller.quorum.voters
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # the internal topics on one node: replication factor 1, and one partition each (a consumer
        # group's first use creates __consumer_offsets: 50 partitions by default, seconds here)
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # retention and compaction within seconds of a topic asking for them (defaults: 5 min, 15 s),
        # and a deleted segment's files gone 1 s later (default 60 s)
        "log.retention.check.interval.ms": "1000",
        "log.cleaner.backoff.ms": "1000",
        "log.segment.delete.delay.ms": "1000",
        # a topic exists when a test or the engine created it, never because a client named it
        "auto.create.topics.enable": "false",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def answers(port: int, timeout: float = 2.0) -> bool:
    """Whether a Kafka broker on 127.0.0.1:`port` answers an ApiVersions request (v0: the oldest, which
    every broker answers, if only with an error code). A port that accepts connections is not enough:
    Kafka binds its listeners before it processes requests."""
    correlation = 0x44535221
    body = struct.pack(">hhih", 18, 0, correlation, -1)  # api key ApiVersions, version 0, id, no client id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            head = b""
            while len(head) < 8:
                chunk = sock.recv(8 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    return struct.unpack(">ii", head)[1] == correlation


class LocalBroker:
    """One Kafka 4.1 broker (KRaft, its own controller) on 127.0.0.1, on ports chosen at start: a
    context manager, or start() and stop(). `bootstrap` is its address for clients ("127.0.0.1:PORT").

    `jar_dir`: a folder of Kafka's jars (an Apache Kafka distribution's libs/ does); default, the
    kafka-broker jars from lake/jars.py, fetched through `mvn` on first use when `fetch`. `parent`:
    where its temporary folder goes (default: the system's temporary folder). `heap`: the JVM's -Xmx.
    """

    def __init__(self, jar_dir: Path | None = None, fetch: bool = True, parent: Path | None = None,
                 heap: str = "512m", start_timeout: float = START_TIMEOUT) -> None:
        self._jar_dir = jar_dir
        self._fetch = fetch
        self._parent = parent
        self._heap = heap
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self._port = 0
        self.controller_port = 0
        self.started_in = 0.0  # seconds the last start() took, from its call to the first answer

    @property
    def port(self) -> int:
        if self._proc is None:
            raise RuntimeError("the broker is not running: start() it first")
        return self._port

    @property
    def bootstrap(self) -> str:
        """bootstrap.servers for clients: "127.0.0.1:PORT" (RuntimeError before start())."""
        return f"127.0.0.1:{self.port}"

    @property
    def root(self) -> Path:
        """The broker's temporary folder: server.properties, log4j2.properties, data/, broker.log."""
        if self._root is None:
            raise RuntimeError("the broker is not running: start() it first")
        return self._root

    @property
    def log(self) -> Path:
        """The broker JVM's output (WARN and above, and the line saying it started)."""
        return self.root / "broker.log"

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except (OSError, RuntimeError):
            return ""

    def _classpath(self) -> str:
        folder = self._jar_dir or jars.broker(fetch=self._fetch)[0].parent
        if not any(Path(folder).glob("kafka_2.13-*.jar")):
            raise EnvironmentSetupError(f"no Kafka broker jar (kafka_2.13-*.jar) in {folder}")
        return f"{folder}/*"

    def _java(self, classpath: str) -> list[str]:
        java = java_binary()
        if java is None:
            raise EnvironmentSetupError("Java was not found: the Kafka broker needs Java 17 or newer, on the PATH "
                                        "or under JAVA_HOME")
        return [str(java), f"-Xmx{self._heap}", "-Xms64m", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}", "-cp", classpath]

    def start(self) -> LocalBroker:
        """Write the configuration, format the storage (`kafka.tools.StorageTool`), start the broker and
        wait until it answers requests (4-7 s; EnvironmentSetupError with the log's tail when it exits
        or does not answer within `start_timeout`). Fetches the jars first when they are not cached
        (`mvn`, ~43 MB once). Returns the broker itself."""
        if self._proc is not None:
            raise RuntimeError("the broker is already running")
        began = time.monotonic()
        classpath = self._classpath()
        self._root = Path(tempfile.mkdtemp(prefix="dsr-kafka-", dir=self._parent))
        try:
            self._start(classpath)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _start(self, classpath: str) -> None:
        root = self.root
        self._port, self.controller_port = free_port(), free_port()
        while self.controller_port == self._port:
            self.controller_port = free_port()
        config = root / "server.properties"
        config.write_text(server_properties(root / "data", self._port, self.controller_port))
        (root / "log4j2.properties").write_text(LOG4J2)
        java = self._java(classpath)
        tool = [*java, "kafka.tools.StorageTool"]
        cluster = self._tool([*tool, "random-uuid"], "random-uuid").strip().splitlines()[-1]
        self._tool([*tool, "format", "-t", cluster, "-c", str(config), "--standalone"], "format")
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen([*java, "kafka.Kafka", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=root, start_new_session=True)
        atexit.register(self.stop)  # never outlive the process that started it
        deadline = time.monotonic() + self._start_timeout
        while not answers(self._port):
            if self._proc.poll() is not None:
                raise EnvironmentSetupError(f"the Kafka broker exited with {self._proc.returncode} while starting; "
                                            f"the end of its log ({self.log}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise EnvironmentSetupError(f"the Kafka broker did not answer on {self.bootstrap} within "
                                            f"{self._start_timeout:.0f} s; the end of its log ({self.log}):\n"
                                            f"{self.log_tail()}")
            time.sleep(0.2)

    def _tool(self, command: list[str], what: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.root, stdin=subprocess.DEVNULL,
                              timeout=120)
        if done.returncode != 0:
            raise EnvironmentSetupError(f"Kafka's storage tool ({what}) failed with exit code {done.returncode}:\n"
                                        f"{(done.stdout + done.stderr)[-_LOG_TAIL_CHARS:]}")
        return done.stdout

    def stop(self) -> None:
        """Stop the broker (SIGTERM to its process group, SIGKILL after STOP_TIMEOUT s) and remove its
        folder, data and log included. Does nothing when it is not running."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
