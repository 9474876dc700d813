"""Leaks: after completion no file the engine wrote, and no log line, holds an erased person's identifier.

Every byte of every file under the lakehouse root is scanned (warehouse: data, delete and ledger
table files, manifests, manifest lists, metadata JSON, version hints; access exports; the run
report; the key file), raw and decoded: compressed Parquet pages through pyarrow (values, column
statistics, key-value metadata), compressed Avro manifests through pyiceberg's Avro reader,
gzip/zip members and JSON strings (escapes decoded). Log output of the run is scanned too: Python
logging (py4j included) and Spark's log4j, raised to INFO for the run. Then the HMAC key is rotated
on the same lakehouse: every completed request stays verifiable under the key that hashed it.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyspark.sql.types import StringType

from helpers import DELTA_LAYOUTS, HOSTILE, SEED, USER_KEY, add_subjects, delta_settings, ledger_table, make_settings
from lakehouse_dsr import suppress, synth
from lakehouse_dsr.keys import KEY_ENV, key_id, load_key, retired_file, rotate_key
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages.verify import stored_hashes, verify_completed, verify_table

pytestmark = pytest.mark.slow  # a full cycle with DEBUG logging captured: make test-slow

LONG = 8  # values this long are also searched as substrings (and as 15-character prefixes: manifest bounds)


@dataclass(frozen=True)
class Needle:
    """One identifier of an erased subject. Messages name it by (subject index, kind), never by value."""

    subject: int
    kind: str
    value: str

    @property
    def label(self) -> str:
        return f"subject {self.subject} {self.kind}"

    @property
    def exact(self) -> bytes:
        return self.value.encode("utf-8")

    @property
    def patterns(self) -> tuple[bytes, ...]:
        if len(self.value) < LONG:  # "%" or "_" occur everywhere as substrings: whole values only
            return ()
        return tuple({self.exact, self.value[:15].encode("utf-8")})


@dataclass
class Hits:
    """{channel: {(file, needle label)}}, plus what was scanned, so that a clean result is not vacuous."""

    found: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    scanned: dict[str, int] = field(default_factory=dict)

    def add(self, channel: str, where: str, needles: set[Needle]) -> None:
        if needles:
            self.found.setdefault(channel, set()).update((where, n.label) for n in needles)

    def count(self, kind: str) -> None:
        self.scanned[kind] = self.scanned.get(kind, 0) + 1

    def labels(self, channel: str | None = None) -> set[str]:
        return {label for c, hits in self.found.items() if channel in (None, c) for _, label in hits}


class Scanner:
    def __init__(self, needles: list[Needle]):
        self.needles = needles
        self.hits = Hits()

    # -- matching -------------------------------------------------------------------------------
    def in_bytes(self, data: bytes) -> set[Needle]:
        return {n for n in self.needles if any(p in data for p in n.patterns)}

    def in_leaves(self, leaves) -> set[Needle]:
        found = set()
        for leaf in leaves:
            data = leaf.encode("utf-8", "surrogatepass") if isinstance(leaf, str) else bytes(leaf)
            found |= {n for n in self.needles if data == n.exact or any(p in data for p in n.patterns)}
        return found

    # -- files ----------------------------------------------------------------------------------
    def scan_tree(self, root: Path) -> Hits:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.scan_file(path)
        return self.hits

    def scan_file(self, path: Path) -> None:
        self.hits.count("files")
        self.scan_data(path.read_bytes(), str(path), path)

    def scan_data(self, data: bytes, where: str, path: Path | None = None) -> None:
        self.hits.add("raw bytes", where, self.in_bytes(data))
        if data[:4] == b"PAR1" and data[-4:] == b"PAR1":
            self._parquet(data, where)
        elif data[:4] == b"Obj\x01":
            self._avro(path, where)
        elif data[:2] == b"\x1f\x8b":
            self.hits.count("gzip")
            self.scan_data(gzip.decompress(data), f"{where}!gunzip")
        elif data[:4] == b"PK\x03\x04":
            self.hits.count("zip")
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                for member in zf.namelist():
                    self.scan_data(zf.read(member), f"{where}!{member}")
        else:
            self._text(data, where)

    def _parquet(self, data: bytes, where: str) -> None:
        self.hits.count("parquet")
        file = pq.ParquetFile(io.BytesIO(data))
        table = file.read()  # every column, every row group
        self.hits.add("parquet values", where, self.in_leaves(_walk(table.to_pylist())))
        meta, stats = file.metadata, []
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                s = meta.row_group(g).column(c).statistics
                if s is not None and s.has_min_max:
                    stats += [s.min, s.max]
        self.hits.add("parquet statistics", where, self.in_leaves(_walk(stats)))
        kv = dict(meta.metadata or {})
        kv.update(file.schema_arrow.metadata or {})
        self.hits.add("parquet metadata", where, self.in_leaves(_walk(kv)))

    def _avro(self, path: Path | None, where: str) -> None:
        """Iceberg manifests and manifest lists: deflate-compressed Avro, decoded record by record."""
        self.hits.count("avro")
        with AvroFile(PyArrowFileIO().new_input(str(path))) as avro:
            header = [avro.header.meta]
            records = list(avro)
        self.hits.add("avro records", where, self.in_leaves(_walk([header, records])))

    def _text(self, data: bytes, where: str) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        try:
            doc = json.loads(text)
        except ValueError:
            return
        self.hits.count("json")
        self.hits.add("json strings", where, self.in_leaves(_walk(doc)))


def _walk(value):
    """Every str/bytes leaf of nested lists, tuples, dicts and pyiceberg Records."""
    if isinstance(value, str | bytes | bytearray):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(k)
            yield from _walk(v)
    elif isinstance(value, list | tuple | set):
        for v in value:
            yield from _walk(v)
    elif hasattr(value, "_data"):  # pyiceberg Record
        yield from _walk(list(value._data))


def _needles(ids: list[str], emails: dict[str, str]) -> list[Needle]:
    out = []
    for i, sid in enumerate(ids):
        out.append(Needle(i, "user_id", sid))
        if sid in emails:
            out.append(Needle(i, "email", emails[sid]))
    return out


def _spark_log_to(spark, path: Path, level: str = "INFO"):
    """Send every log4j event at `level` and above to `path`; returns a function that undoes it."""
    jvm = spark.sparkContext._jvm
    core = jvm.org.apache.logging.log4j.core
    ctx = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = ctx.getConfiguration()
    layout = core.layout.PatternLayout.newBuilder().withPattern("%p %c: %m%n%ex").build()
    appender = (core.appender.FileAppender.newBuilder().withFileName(str(path)).setName("dsr-leak-test")
                .setLayout(layout).build())
    appender.start()
    config.addAppender(appender)
    loggers = config.getLoggers()
    previous = {name: loggers.get(name).getLevel() for name in loggers.keySet()}
    new_level = jvm.org.apache.logging.log4j.Level.toLevel(level)
    # The console keeps its own level: only the file gets the extra lines.
    console = {name: [a for a in loggers.get(name).getAppenders().values()] for name in previous}
    for name in previous:
        for a in console[name]:
            loggers.get(name).removeAppender(a.getName())
        loggers.get(name).setLevel(new_level)
        loggers.get(name).addAppender(appender, None, None)
    ctx.updateLoggers()

    def undo():
        for name, lvl in previous.items():
            loggers.get(name).removeAppender("dsr-leak-test")
            loggers.get(name).setLevel(lvl)
            for a in console[name]:
                loggers.get(name).addAppender(a, None, None)
        ctx.updateLoggers()
        appender.stop()

    return undo


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module", params=["iceberg", "mixed"])
def lake(spark, tmp_path_factory, request):
    """A tiny lakehouse with hostile ids, scanned, then one run of erase + access requests with logs captured:
    all Iceberg, or with the events and the newsletter in Delta (their logs scanned with the rest).

    Shared by the leak checks and, after them, the key rotation test (which adds to it)."""
    root = tmp_path_factory.mktemp(f"leaks-{request.param}")
    settings = delta_settings(root, DELTA_LAYOUTS[request.param], erase={"collateral_check": "count"},
                              purge={"orphan_min_age_minutes": 60})
    attach(spark, settings)
    synth.generate(spark, settings, users=20, events=200, seed=SEED, batches=2)
    add_subjects(spark, settings, HOSTILE, "gone")
    add_subjects(spark, settings, ["kept-a", "kept-b"], "kept")  # not requested: must survive, not searched
    users = {r.user_id: r.email for r in spark.table(settings.table("demo.users")).select("user_id", "email").collect()}
    erased = [synth.user_id(SEED, i) for i in range(3)] + HOSTILE
    accessed, waiting = synth.user_id(SEED, 5), synth.user_id(SEED, 6)
    needles = _needles(erased, users)
    before = Scanner(needles).scan_tree(root)

    submitted = Ledger(settings).submit([RequestInput(s, "erase") for s in erased] + [RequestInput(accessed, "access")])
    logs = tmp_path_factory.mktemp("logs")
    undo = _spark_log_to(spark, logs / "spark.log")
    python_log, root_logger = _Records(), logging.getLogger()
    level = root_logger.level
    root_logger.addHandler(python_log)
    root_logger.setLevel(logging.DEBUG)  # every Python logger, py4j's commands and answers included
    try:
        report = run(spark, settings)
    finally:
        root_logger.removeHandler(python_log)
        root_logger.setLevel(level)
        undo()
    Ledger(settings).submit([RequestInput(waiting, "opt_out")])  # open after the run: hashed under the first key
    report_file = root / "reports" / "run.json"
    report.write(report_file)
    (logs / "python.log").write_text("\n".join(python_log.lines), encoding="utf-8")
    return {"settings": settings, "root": root, "users": users, "erased": erased, "accessed": accessed,
            "waiting": waiting, "needles": needles, "before": before, "report": report, "report_file": report_file,
            "logs": logs, "submitted": submitted.created}


def test_the_scanner_finds_identifiers_in_every_form(lake, tmp_path):
    """Positive controls: before the run the same scanner finds every erased subject, through every channel."""
    needles, before = lake["needles"], lake["before"]
    assert len(needles) == 2 * len(lake["erased"])  # every erased subject has an email to follow
    assert before.labels("parquet values") == {n.label for n in needles}  # zstd pages: invisible to a raw grep
    assert before.labels("parquet statistics") and before.labels("avro records")
    assert "subject 4 user_id" in before.labels("avro records")  # HOSTILE[1] == "%": a 1-character lower bound
    (tmp_path / "plain.txt").write_bytes(b"..." + needles[0].exact + b"...")
    (tmp_path / "escaped.json").write_text(json.dumps({"note": HOSTILE[3]}))  # \u-escaped, not raw UTF-8
    (tmp_path / "packed.gz").write_bytes(gzip.compress(needles[1].exact))
    control = Scanner(needles).scan_tree(tmp_path)
    assert control.labels("raw bytes") == {needles[0].label, needles[1].label}  # the second inside the gzip
    assert control.labels("json strings") == {"subject 6 user_id"}


def test_no_file_or_log_line_holds_an_erased_identifier(lake):
    report, root, logs = lake["report"], lake["root"], lake["logs"]
    assert {r.status for r in report.requests} == {"completed"} and len(report.requests) == len(lake["erased"]) + 1
    assert (logs / "spark.log").stat().st_size > 0 and (logs / "python.log").stat().st_size > 0  # captured
    after = Scanner(lake["needles"])
    after.scan_tree(root)  # warehouse (demo and ledger tables), key file, exports, report
    after.scan_tree(logs)
    assert not after.hits.found, sorted(after.hits.found.items())
    key = load_key(lake["settings"].key_file())
    for log in logs.iterdir():  # nor does the HMAC key reach a log
        assert key.hex().encode() not in log.read_bytes() and key not in log.read_bytes(), log.name
    scanned = after.hits.scanned
    assert scanned["parquet"] >= 12 and scanned["avro"] >= 12 and scanned["json"] >= 10, scanned
    ledger_files = [p for t in ("requests", "request_keys", "audit", "steps")
                    for p in (root / "wh" / "dsr" / t).rglob("*.parquet")]
    assert len({p.parent.parent.name for p in ledger_files}) == 4  # every ledger table has data files, scanned
    # The export holds the access subject's own data: the scanner finds it there.
    own = _needles([lake["accessed"]], lake["users"])
    assert Scanner(own).scan_tree(lake["settings"].export.directory).labels() == {n.label for n in own}


def test_key_report_and_exports_are_owner_only(lake):
    settings, report = lake["settings"], lake["report"]
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(settings.key_file()) == 0o600
    assert mode(lake["report_file"]) == 0o600
    run_dir = Path(report.export["directory"])
    assert mode(settings.export.directory) == 0o700 and mode(run_dir) == 0o700
    packages = list(run_dir.iterdir())
    assert len(packages) == 2 and {mode(p) for p in packages} == {0o600}  # one package + manifest.json


def _key_ids(spark, settings) -> dict[str, set]:
    """{request_id: key ids of its stored hashes} (hashes and key ids only: no identifier)."""
    out: dict[str, set] = {}
    for r in ledger_table(spark, settings, "dsr.request_keys").select("request_id", "key_id").distinct().collect():
        out.setdefault(r.request_id, set()).add(r.key_id)
    return out


def test_key_rotation_keeps_completed_requests_verifiable(spark, lake, monkeypatch):
    """Runs last: rotates the key of the shared lakehouse and brings an erased person back."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    settings, users, waiting = lake["settings"], lake["users"], lake["waiting"]
    first, second, other = lake["erased"][0], synth.user_id(SEED, 7), synth.user_id(SEED, 8)
    done_before = lake["submitted"][0]  # completed under the first key, like every erase request of the run
    old_key = load_key(settings.key_file())

    rotation = rotate_key(settings.key_file())
    assert rotation.old_id == key_id(old_key) and rotation.new_id == key_id(load_key(settings.key_file()))
    assert rotation.new_id != rotation.old_id and rotation.retired == 1
    assert retired_file(settings.key_file()).read_text() == old_key.hex() + "\n"
    assert {stat.S_IMODE(p.stat().st_mode) for p in (settings.key_file(), retired_file(settings.key_file()))} == {0o600}

    # Dedup still works: the open opt-out's subject hash was made by the retired key.
    again = Ledger(settings).submit([RequestInput(waiting, "opt_out"), RequestInput(second, "erase")])
    assert again.duplicates == 1 and len(again.created) == 1
    (done_after,) = again.created
    outcomes = {r.request_id: r.status for r in run(spark, settings).requests}  # the erasure and the open opt-out
    assert outcomes[done_after] == "completed" and list(outcomes.values()) == ["completed", "completed"]
    ids = _key_ids(spark, settings)
    assert ids[done_before] == {rotation.old_id} and ids[done_after] == {rotation.new_id}

    # Every proof holds, each under the key that made its hashes.
    results = verify_completed(spark, settings)
    assert set(results) == {*lake["submitted"][:len(lake["erased"])], done_after} and not any(results.values())
    late = spark.createDataFrame([("late-1", first)], "event_id string, user_id string")
    late.selectExpr("event_id", "user_id", "'login' event_type", "timestamp'2024-07-01' event_timestamp",
                    "null page_url", "null product_id", "'late backfill' event_details") \
        .writeTo(settings.table("demo.events")).append()
    results = verify_completed(spark, settings, [done_before, done_after])
    assert results[done_after] == []
    assert "demo.events: 1 rows in the current snapshot" in results[done_before]
    assert all(r.startswith("demo.events: 1 rows in ") for r in results[done_before])  # live, history, storage

    # Suppression drops both people (ids and emails), whichever key hashed them.
    incoming = spark.createDataFrame([(first,), (second,), (other,)], "user_id string")
    assert [r.user_id for r in suppress(incoming, "user_id", settings=settings).collect()] == [other]
    mails = spark.createDataFrame([(users[first],), (users[second],), (users[other],)], "mail string")
    assert [r.mail for r in suppress(mails, "mail", "email", settings=settings).collect()] == [users[other]]

    # Hashes written before key ids existed (NULL) are checked under every key of the ring (live check only).
    keys = settings.table("dsr.request_keys")

    def user_ids():  # read afresh after each change (a DataFrame keeps the table state it was analysed with)
        return stored_hashes(spark, Ledger(settings), [done_before, done_after], 100).where("key_type = 'user_id'")

    spark.catalog.refreshTable(keys)  # written by the control plane (pyiceberg) since this session looked
    spark.sql(f"UPDATE {keys} SET key_id = NULL")
    assert {r.key_id for r in user_ids().collect()} == {None}
    live = verify_table(Lake.of(spark, settings), settings.key_file(), "demo.events", USER_KEY,
                        {"user_id": StringType()}, user_ids(), Ledger(settings).keyring, physical=False)
    assert (live.live, set(live.failing)) == (1, {done_before})
    # request ids and key ids only in SQL text, never an identifier
    spark.sql(f"UPDATE {keys} SET key_id = '{rotation.old_id}' WHERE request_id = '{done_before}'")
    spark.sql(f"UPDATE {keys} SET key_id = '{rotation.new_id}' WHERE request_id = '{done_after}'")

    # Destroying the retired key shreds the proof: the request can no longer be verified, and says so.
    retired_file(settings.key_file()).unlink()
    live = verify_table(Lake.of(spark, settings), settings.key_file(), "demo.events", USER_KEY,
                        {"user_id": StringType()}, user_ids(), Ledger(settings).key, physical=False)
    assert live.failing == {done_before: [f"demo.events: hashed under key {rotation.old_id}, which no keyring "
                                          "holds any more: cannot be verified"]}


def test_ledger_of_an_earlier_version_gets_the_key_id_column(spark, tmp_path):
    settings = make_settings(tmp_path)
    attach(spark, settings)
    spark.sql(f"CREATE NAMESPACE {settings.namespace('dsr')}")
    old_schema = "request_id string, key_type string, key_hash string"
    spark.sql(f"CREATE TABLE {settings.table('dsr.request_keys')} ({old_schema}) USING iceberg")
    Ledger(settings).ensure()
    upgraded = Ledger(settings).store.load("request_keys").schema()
    assert [f.name for f in upgraded.fields] == ["request_id", "key_type", "key_hash", "key_id"]
