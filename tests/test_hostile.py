"""Hostile and malformed input: identifiers, request CSVs, data maps, config, an unreachable catalog.

Every rejection is a DsrError with a clear message (exit 2 through the CLI) that never shows an
identifier, and nothing changes: the snapshot ids of the demo and ledger tables stay the same.
Hostile identifiers that are valid are stored as given and never become SQL text.
"""

from __future__ import annotations

import csv
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from helpers import HOSTILE, SEED, add_subjects, datamap_dict, make_settings, snapshot_ids, write_config
from lakehouse_dsr import synth
from lakehouse_dsr.cli import entry
from lakehouse_dsr.config import Settings, load_settings, settings_from_dict
from lakehouse_dsr.datamap import DataMap, demo_datamap
from lakehouse_dsr.exceptions import CatalogUnavailableError, ConfigError, DataMapError, RequestInputError
from lakehouse_dsr.keys import KEY_ENV
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger import requests
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import REGULATIONS, REQUEST_TYPES, RequestInput, read_requests_csv
from lakehouse_dsr.runner import run

DSR = Path(sys.executable).parent / "dsr"
TABLES = ["demo.users", "demo.events", "demo.newsletter", "demo.orders",
          "dsr.requests", "dsr.request_keys", "dsr.audit", "dsr.steps"]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# -- strategies ---------------------------------------------------------------------------------
FRAGMENTS = ["'", '"', "`", "\\", "%", "_", "%_%", "\x00", ";", "--", "/*", "*/", "' OR '1'='1",
             "'; DROP TABLE demo.events; --", "`; DROP TABLE dsr.requests; --", "${jndi:ldap://x/a}", "\n", "\r\n",
             "\t", "\u2028", "\x85", "\u202e", "\ufeff", "\u200b", "Jos\u00e9", "e\u0301", "\u4e2d\u6587",
             "\U0001f600", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629"]
TEXT = st.characters(exclude_categories=("Cs",))  # every code point that is text (surrogates: see below)
fragment = st.sampled_from(FRAGMENTS) | st.text(TEXT, min_size=1, max_size=8)
identifiers = (st.lists(fragment, min_size=1, max_size=6).map("".join)
               | st.tuples(fragment, st.integers(0, 16)).map(lambda t: (t[0] * 10_000)[:10_000 + t[1]]))
valid_ids = identifiers.filter(lambda s: s.strip())
WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2007\u200a\u2028\u2029\u202f\u205f\u3000"
blank_ids = st.text(st.sampled_from(WHITESPACE), max_size=40)
# Identifiers people really file requests under: never echoed, whatever column they end up in.
real_ids = st.emails() | st.uuids().map(str) | st.integers(10**5, 10**12).map(lambda n: f"cust-{n}")


def drawn(strategy, n: int, seed_value: int = 20250131) -> list:
    """`n` examples of `strategy`, the same ones every time: for a test too slow to repeat per example."""
    out: list = []

    @seed(seed_value)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        out.append(value)

    collect()
    return list(dict.fromkeys(out))


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    return path


def words(text: str) -> str:
    return " ".join(text.split())


# -- identifiers (pure Python) --------------------------------------------------------------------
@FAST
@given(subject=valid_ids, type_=st.sampled_from(REQUEST_TYPES), regulation=st.sampled_from(REGULATIONS))
def test_hostile_identifier_is_accepted_unchanged(subject, type_, regulation):
    assert RequestInput(subject, type_, regulation).validated().subject_id == subject


@FAST
@given(subject=blank_ids)
def test_empty_or_whitespace_identifier_is_rejected(subject):
    with pytest.raises(RequestInputError, match="subject id is empty"):
        RequestInput(subject, "erase").validated("--subject")


@FAST
@given(head=valid_ids, surrogate=st.characters(categories=("Cs",)), tail=st.text(TEXT, max_size=5))
def test_identifier_that_is_not_unicode_text_is_rejected(head, surrogate, tail):
    """What undecodable command-line bytes become in Python: it could not be hashed or stored."""
    with pytest.raises(RequestInputError, match="not valid Unicode text") as info:
        RequestInput(head + surrogate + tail, "erase").validated()
    assert surrogate not in str(info.value)


def test_identifier_over_the_limit_is_rejected():
    with pytest.raises(RequestInputError, match="longer than 65536 characters"):
        RequestInput("\x00" * 65_537, "erase").validated()


@FAST
@given(value=st.text(TEXT, max_size=30) | real_ids)
def test_unknown_request_type_or_regulation(value):
    type_ = value.strip().lower()
    if type_ not in REQUEST_TYPES:
        with pytest.raises(RequestInputError, match="unknown request type") as info:
            RequestInput("someone", type_).validated()
        assert "expected one of erase, access, opt_out" in str(info.value)
    if value not in REGULATIONS:
        with pytest.raises(RequestInputError, match=r"unknown regulation .*\(expected one of gdpr, ccpa\)"):
            RequestInput("someone", "erase", value).validated()


@FAST
@given(subject=real_ids)
def test_identifier_in_the_type_column_is_not_echoed(tmp_path, subject):
    f = write_csv(tmp_path / "swapped.csv", [["subject_id", "type"], ["erase", subject]])
    with pytest.raises(RequestInputError, match="line 2: unknown request type") as info:
        read_requests_csv(f)
    assert subject.lower() not in str(info.value) and "not shown" in str(info.value)


@FAST
@given(when=st.datetimes(min_value=datetime.now() + timedelta(days=2), timezones=st.just(UTC)))
def test_received_in_the_future_is_rejected(when):
    """Up to 9999-12-31, whose due date does not exist (it used to fail with a raw ValueError on submit)."""
    with pytest.raises(RequestInputError, match="is in the future"):
        RequestInput("someone", "erase", "gdpr", when).validated()


# -- request CSVs (pure Python) -------------------------------------------------------------------
@FAST
@given(subjects=st.lists(valid_ids, min_size=1, max_size=5),
       type_=st.sampled_from(["erase", " ERASE", "Access ", "opt_out"]), regulation=st.sampled_from(["", "CCPA"]))
def test_csv_round_trips_hostile_identifiers(tmp_path, subjects, type_, regulation):
    """Quotes, commas, NUL, line breaks (also U+2028, U+0085) inside a field are part of the identifier."""
    f = write_csv(tmp_path / "r.csv", [["subject_id", "type", "regulation"], *([s, type_, regulation]
                                                                              for s in subjects)])
    rows = read_requests_csv(f)
    assert [r.subject_id for r in rows] == subjects
    assert {(r.request_type, r.regulation) for r in rows} == {(type_.strip().lower(), regulation.lower() or "gdpr")}


COLUMN_NAMES = ["subject_id", "type", "regulation", "received_at", " type", "user", "kind", "Subject_ID",
                "subject id", "email", "", "[/x]"]
VALUES = {"subject_id": "s1", "type": "erase", "regulation": "ccpa", "received_at": "2025-01-31"}


@FAST
@given(header=st.lists(st.sampled_from(COLUMN_NAMES), max_size=6))
def test_csv_header_permutations(tmp_path, header):
    columns = [c.strip() for c in header]
    valid = {"subject_id", "type"} <= set(columns) <= set(VALUES) and len(set(columns)) == len(columns)
    f = write_csv(tmp_path / "h.csv", [header, [VALUES.get(c, "x") for c in columns]] if header else [])
    if valid:
        assert list(read_requests_csv(f)) == [RequestInput("s1", "erase", "ccpa" if "regulation" in columns else "gdpr",
                                                     datetime(2025, 1, 31, tzinfo=UTC) if "received_at" in columns
                                                     else None)]
    else:
        with pytest.raises(RequestInputError, match=r"header must be subject_id,type\[,regulation\]"):
            read_requests_csv(f)


@FAST
@given(rows=st.lists(st.tuples(real_ids | st.text(st.characters(categories=("L",)), min_size=3, max_size=12),
                               st.sampled_from(REQUEST_TYPES)), min_size=1, max_size=4))
def test_csv_without_header_is_rejected_without_showing_its_first_row(tmp_path, rows):
    f = write_csv(tmp_path / "r.csv", [list(r) for r in rows])
    with pytest.raises(RequestInputError, match="header must be .*is the header line missing") as info:
        read_requests_csv(f)
    assert rows[0][0] not in str(info.value)


@FAST
@given(encoding=st.sampled_from(["latin-1", "cp1252", "utf-16-le", "utf-16-be", "utf-32"]),
       subject=st.text(st.sampled_from("ab1\u00e9\u00fc\u00df\u00e0\u00e7\u00f1"), min_size=1, max_size=12)
       .filter(lambda s: not s.isascii()))
def test_csv_in_another_encoding_is_rejected(tmp_path, encoding, subject):
    f = tmp_path / "r.csv"
    f.write_bytes(f"subject_id,type\n{subject},erase\n".encode(encoding))
    with pytest.raises(RequestInputError, match="is not UTF-8 text .*save it as UTF-8") as info:
        read_requests_csv(f)
    assert subject not in str(info.value)


@FAST
@given(extra=st.integers(1, 5), missing=st.booleans())
def test_csv_row_with_extra_or_missing_fields(tmp_path, extra, missing):
    row = ["u1"] if missing else ["u1", "erase", *["x"] * extra]
    f = write_csv(tmp_path / "r.csv", [["subject_id", "type"], ["u0", "erase"], row])
    with pytest.raises(RequestInputError, match="line 3: expected 2 fields"):
        read_requests_csv(f)


@FAST
@given(rows=st.lists(st.tuples(st.text("ab1 -_.@\u00e9\u2028", min_size=1, max_size=8),
                               st.sampled_from(["erase", "ACCESS", " opt_out "]),
                               st.sampled_from(["", "gdpr", " CCPA"]), st.sampled_from(["", "2025-01-31"])),
                     min_size=1, max_size=12),
       blank=st.integers(0, 12))
def test_csv_read_alike_whether_plain_or_quoted(tmp_path, rows, blank):
    """A file with no quotes is split without the csv module (a list per row costs a second at a
    million): it reads exactly as the same requests quoted, blank lines and a bad row's line included."""
    header = ["subject_id", "type", "regulation", "received_at"]
    plain, quoted = tmp_path / "plain.csv", tmp_path / "quoted.csv"
    lines = [",".join(r) + "\n" for r in rows]
    plain.write_text(",".join(header) + "\n" + "".join(lines[:blank]) + "\n" + "".join(lines[blank:]), encoding="utf-8")
    with quoted.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([header, *rows[:blank], [], *rows[blank:]])

    def read(path: Path) -> list[RequestInput] | str:
        try:
            return list(read_requests_csv(path))
        except RequestInputError as exc:
            return str(exc).replace(str(path), "FILE")

    assert read(plain) == read(quoted)
    # both readings compared: the plain file takes the split, the quoted one the csv module
    text = plain.read_text(encoding="utf-8")
    assert requests._plain_fields(text, len(header)) is not None
    assert requests._plain_fields(quoted.read_text(encoding="utf-8"), len(header)) is None


@FAST
@given(text=st.text(TEXT, min_size=1, max_size=30).filter(lambda t: t.strip() and not _isoformat(t)))
def test_csv_with_bad_received_at(tmp_path, text):
    f = write_csv(tmp_path / "r.csv", [["subject_id", "type", "received_at"], ["u1", "erase", text]])
    with pytest.raises(RequestInputError, match=r"line \d+: received_at .*is not an ISO-8601 date or time"):
        read_requests_csv(f)


def _isoformat(text: str) -> bool:
    try:
        datetime.fromisoformat(text.strip())
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("content, message", [
    ("subject_id,type,type\nu1,erase,access\n", "type given twice"),
    ("subject_id,type\n\"" + "k" * 200_000 + "\",erase\n", "line 2: not valid CSV (field larger than field limit"),
    ("subject_id,type,received_at\nu1,erase,9999-12-31\n", "line 2: received_at 9999-12-31T00:00:00+00:00 is in "
                                                           "the future"),
    ("subject_id,type,regulation\nu1,erase,\u00e9gdpr\n", "line 2: unknown regulation (value not shown)"),
])
def test_csv_rejections(tmp_path, content, message):
    f = tmp_path / "r.csv"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(RequestInputError) as info:
        read_requests_csv(f)
    assert message in str(info.value)


# -- config and data map values (pure Python) -------------------------------------------------------
PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
not_plain = (st.text(TEXT, max_size=20) | st.sampled_from(["a`b", "x`; DROP TABLE t; --", "users\n", "1st", "a b",
                                                           "${x}", "t\x00"])).filter(lambda s: not PLAIN.fullmatch(s))


NAME_PLACES = {
    "catalog": lambda n: {"catalog": {"name": n}},
    "ledger_namespace": lambda n: {"ledger_namespace": n},
    "demo_namespace": lambda n: {"demo_namespace": n},
    "table": lambda n: {"datamap": {"tables": {f"demo.{n}": {"key": "k"}}}},
    "key": lambda n: {"datamap": {"tables": {"demo.t": {"key": n}}}},
    "redact": lambda n: {"datamap": {"tables": {"demo.t": {"key": "k", "action": "redact", "redact": ["k", n]}}}},
    "keys": lambda n: {"datamap": {"tables": {"demo.t": {"keys": {"k": {}, n: {}}}}}},
    "key group": lambda n: {"datamap": {"tables": {"demo.t": {"action": "redact",
                                                              "keys": {"k": {"redact": ["k", n]}}}}}},
    "linked column": lambda n: {"datamap": {"identifiers": {"email": {"table": "demo.t", "subject_column": "k",
                                                                      "column": n}},
                                            "tables": {"demo.t": {"key": "k"}}}},
}


@FAST
@given(name=not_plain, place=st.sampled_from(sorted(NAME_PLACES)))
def test_names_that_would_go_into_sql_must_be_plain(name, place):
    """Catalog, namespace, table and column names are quoted into SQL: anything but a plain name is refused."""
    with pytest.raises(ConfigError, match="must be (a plain identifier|written namespace.table|a column name or a "
                                          "struct path)"):
        settings_from_dict(NAME_PLACES[place](name))


@FAST
@given(section=st.sampled_from([None, "spark", "catalog", "datamap", "purge", "erase", "export"]),
       key=st.text(TEXT, min_size=1, max_size=20))
def test_unknown_config_keys_are_named(section, key):
    model = DataMap if section == "datamap" else Settings if section is None else type(getattr(Settings(), section))
    assume(key not in {field.alias or name for name, field in model.model_fields.items()})  # as written
    raw = {key: 1} if section is None else {section: {key: 1}}
    with pytest.raises(ConfigError, match="Extra inputs are not permitted") as info:
        settings_from_dict(raw)
    assert key in str(info.value)


@FAST
@given(field=st.sampled_from([("purge", "max_delay_days"), ("purge", "safety_margin_days"),
                              ("purge", "orphan_min_age_minutes"), ("purge", "target_file_size_mb"),
                              ("erase", "commit_retries"), ("erase", "max_rounds"), ("erase", "broadcast_max_keys")]),
       value=st.integers(max_value=-1) | st.text(st.sampled_from("abc xyz-"), min_size=1, max_size=5)
       | st.lists(st.integers(), max_size=2))
def test_out_of_range_or_wrong_type_values_are_named(field, value):
    section, name = field
    with pytest.raises(ConfigError, match=rf"{section}\.{name}: "):
        settings_from_dict({section: {name: value}})


@pytest.mark.parametrize("content, message", [
    (b"!!python/object/apply:os.system ['echo pwned']\n", "not valid YAML"),
    (b"catalog: {name: lake}\nspark: !!python/name:os.system\n", "not valid YAML"),
    ("catalog: {name: J\u00f6rg}\n".encode("latin-1"), "not valid YAML"),
    ("catalog: {name: lake}\n".encode("utf-16"), "not valid YAML"),
    (b"export: {format: xml}\n", "export.format"),
    (b"purge: {policy: weekly}\n", "purge.policy"),
    (b"spark: 7\n", "spark: Input should be a valid dictionary"),
    (b"datamap: {tables: {demo.t: {key: k, action: redact, redact: [k, k2], extra: 1}}}\n",
     "datamap.tables.demo.t.extra: Extra inputs are not permitted"),
])
def test_config_file_rejections(tmp_path, content, message):
    cfg = tmp_path / "dsr.yaml"
    cfg.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert message in str(info.value)


@pytest.mark.parametrize("content, message", [("not hex at all", "cannot be used: non-hexadecimal"),
                                              ("", "is empty"), (None, "cannot be used")])
def test_unusable_key_file(spark, tmp_path, monkeypatch, content, message):
    monkeypatch.delenv(KEY_ENV, raising=False)
    key_file = tmp_path / "dsr-secret.key"
    if content is None:
        key_file.mkdir()
    else:
        key_file.write_text(content)
    key_file.chmod(0o700)
    settings = make_settings(tmp_path, secret_key_file=str(key_file))
    with pytest.raises(ConfigError, match=message):
        Ledger(settings).key  # noqa: B018


# -- Spark: identifiers never become SQL text; data maps; CLI -----------------------------------------
@pytest.fixture
def lakehouse(new_lakehouse):
    return new_lakehouse(users=10, events=40)


@pytest.fixture
def sql_texts(monkeypatch):
    """Every SQL text the engine hands Spark: statements and expressions given as strings."""
    texts: list[str] = []

    def recording(original):
        def wrapper(*args, **kwargs):
            texts.extend(a for a in [*args, *kwargs.values()] if isinstance(a, str))
            return original(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(SparkSession, "sql", recording(SparkSession.sql))
    monkeypatch.setattr(F, "expr", recording(F.expr))
    for method in ("selectExpr", "filter", "where"):
        monkeypatch.setattr(DataFrame, method, recording(getattr(DataFrame, method)))
    return texts


# Words of the engine's own SQL (`rewrite_data_files(table => ..., options => map(...))`): a drawn id
# equal to one of them is found in the SQL text without having leaked into it.
ENGINE_SQL_WORDS = {"table", "options", "strategy", "map", "call", "system", "select", "from", "where", "delete",
                    "update", "merge", "into", "using", "true", "false", "set", "null"}
EXTRA = ["\x00", "nul\x00inside", "line\nbreak", "a\u2028b", "`quoted`", "' OR ''='", "100%_done", "\ufeffbom",
         "${jndi:ldap://x/a}"]


@pytest.mark.slow  # a full run / real processes: make test-slow
def test_hostile_identifiers_are_stored_as_given_and_never_become_sql(spark, lakehouse, sql_texts):
    settings = lakehouse
    ids = list(dict.fromkeys(HOSTILE + EXTRA + drawn(valid_ids, 10)))
    assert len(ids) >= 25 and any(len(s) >= 10_000 for s in ids) and any("\x00" in s for s in ids)
    add_subjects(spark, settings, ids, "hx")
    emails = [f"hx{i}@example.net" for i in range(len(ids))]  # linked identifiers, resolved by the run
    ledger = Ledger(settings)
    ledger.ensure()
    before = snapshot_ids(spark, settings, TABLES)
    for blank in ["", " ", "\t\n", "\u3000\u2028"]:
        with pytest.raises(RequestInputError, match="subject id is empty"):
            ledger.submit([RequestInput(ids[0], "erase"), RequestInput(blank, "erase")])
    assert snapshot_ids(spark, settings, TABLES) == before

    sql_texts.clear()
    submitted = ledger.submit([RequestInput(s, "erase") for s in ids])
    assert len(submitted.created) == len(ids) and submitted.duplicates == 0
    assert sorted(r["subject_id"] for r in ledger.requests()) == sorted(ids)

    settings = settings.replace(erase={"collateral_check": "count"})  # the content check adds scans, not SQL text
    # Format v3 keeps Spark's MERGE for the events (rewrite_files serves v1/v2 and writes no SQL), and
    # its deletion vectors send the purge through the rewrite_data_files procedure: both get SQL text.
    spark.sql(f"ALTER TABLE {settings.table('demo.events')} SET TBLPROPERTIES ('format-version'='3')")
    report = run(spark, settings)
    assert any("MERGE INTO" in t for t in sql_texts) and any("rewrite_data_files" in t for t in sql_texts)
    leaked = [i for i, s in enumerate(ids + emails)
              if len(s) >= 3 and s.lower() not in ENGINE_SQL_WORDS and any(s in t for t in sql_texts)]
    assert leaked == [], [(ids + emails)[i][:40] for i in leaked]
    assert not report.failed and len(report.completed) == len(ids)
    remaining = {r.user_id for r in spark.table(settings.table("demo.events")).select("user_id").collect()}
    assert remaining and not remaining & set(ids)


@pytest.fixture
def mismatched(spark, lakehouse):
    """The lakehouse plus tables whose key or redacted columns cannot be used, and one open request."""
    settings = lakehouse
    for ddl in ("maps (k map<string, string>, v string)", "arrays (k array<string>)",
                "strict (user_id string NOT NULL, name string NOT NULL, note string)"):
        spark.sql(f"CREATE TABLE {settings.namespace('demo')}.{ddl} USING iceberg")
    spark.sql(f"INSERT INTO {settings.table('demo.strict')} VALUES ('u1', 'Name', 'x')")
    Ledger(settings).submit([RequestInput(synth.user_id(SEED, 0), "erase")])
    return settings


def test_datamap_that_does_not_match_the_catalog_changes_nothing(spark, mismatched):
    settings = mismatched
    tables = TABLES + ["demo.maps", "demo.arrays", "demo.strict"]
    before = snapshot_ids(spark, settings, tables)
    bad = settings.model_copy(update={"datamap": DataMap.model_validate({
        "identifiers": {"email": {"table": "demo.users", "subject_column": "user_id", "column": "e_mail"}},
        "tables": {
            "demo.events": {"key": "user_id"},
            "demo.gone": {"key": "user_id"},
            "demo.orders": {"key": "buyer"},
            "demo.maps": {"key": "k"},
            "demo.arrays": {"key": "k"},
            "demo.strict": {"key": "user_id", "action": "redact", "redact": ["user_id", "name"]},
        }})})
    with pytest.raises(DataMapError) as info:
        run(spark, bad)
    text = str(info.value)
    for expected in ["the data map does not match the catalog", "table demo.gone cannot be read",
                     "table demo.orders has no column 'buyer'", "table demo.users has no column 'e_mail'",
                     "key column 'k' has type map<string,string>, which cannot hold an identifier",
                     "key column 'k' has type array<string>, which cannot hold an identifier",
                     "column 'user_id' is required (NOT NULL) and cannot be redacted",
                     "column 'name' is required (NOT NULL) and cannot be redacted"]:
        assert expected in text, text
    assert "demo.events" not in text
    assert snapshot_ids(spark, settings, tables) == before
    assert [s.status for s in Ledger(settings).statuses()] == ["received"]


# -- an unreachable catalog ------------------------------------------------------------------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unreachable(root: Path) -> dict:
    return {"spark": {"master": "local[1]", "conf": {"spark.ui.enabled": "false"}},
            "catalog": {"name": "offline", "properties": {"type": "rest", "uri": f"http://127.0.0.1:{closed_port()}"}},
            "secret_key_file": str(root / "dsr-secret.key"), "datamap": datamap_dict(demo_datamap(derived=False))}


def test_unreachable_rest_catalog(spark, tmp_path):
    settings = settings_from_dict(unreachable(tmp_path), base=tmp_path)
    attach(spark, settings)
    message = r"catalog offline cannot be reached: .*Connection refused"
    with pytest.raises(CatalogUnavailableError, match=message):
        Ledger(settings).submit([RequestInput("someone", "erase")])
    with pytest.raises(CatalogUnavailableError, match=message):
        run(spark, settings)
    assert not (tmp_path / "dsr-secret.key").exists()


def test_warehouse_that_cannot_be_created(spark, tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    settings = settings_from_dict({"catalog": {"name": "nowhere", "properties": {
        "type": "hadoop", "warehouse": str(tmp_path / "a-file" / "wh")}},
        "datamap": datamap_dict(demo_datamap(derived=False))}, base=tmp_path)
    attach(spark, settings)
    message = "catalog nowhere cannot be reached: the warehouse .* cannot be created: .* is not a directory"
    with pytest.raises(CatalogUnavailableError, match=message):
        run(spark, settings)
    with pytest.raises(CatalogUnavailableError, match=message):
        Ledger(settings).submit([RequestInput("someone", "erase")])


# -- through the CLI ---------------------------------------------------------------------------------
def dsr_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`dsr ARGS` as the console script runs it (DsrError: exit 2), on the test session."""
    monkeypatch.setattr(sys, "argv", ["dsr", *args])
    try:
        entry()
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, words(out.out), words(out.err)


@pytest.mark.parametrize("command", [["status"], ["verify"], ["extend", "req-x", "--reason", "r"],
                                     ["release", "demo.events", "--reason", "r"]])
def test_cli_commands_with_an_unreachable_catalog(spark, tmp_path, monkeypatch, capsys, command):
    config = tmp_path / "dsr.yaml"
    config.write_text(yaml.safe_dump(unreachable(tmp_path)))
    code, out, err = dsr_in_process(monkeypatch, capsys, "-c", str(config), *command)
    assert code == 2 and "catalog offline cannot be reached" in err and "Traceback" not in out + err


def test_cli_submit_file_rejections_and_duplicates(spark, lakehouse, tmp_path, monkeypatch, capsys):
    settings = lakehouse
    config = write_config(settings, tmp_path / "dsr.yaml")
    Ledger(settings).ensure()
    before = snapshot_ids(spark, settings, TABLES)
    email = "jane.doe+dsr@example.org"
    files = {
        "no-header.csv": (f"{email},erase\n".encode(), "header must be subject_id,type"),
        "latin1.csv": ("subject_id,type\nJos\u00e9,erase\n".encode("latin-1"), "is not UTF-8 text (byte 19)"),
        "utf16.csv": ("subject_id,type\nu1,erase\n".encode("utf-16-le"), "NUL bytes in the header: UTF-16?"),
        "swapped.csv": (f"subject_id,type\nerase,{email}\n".encode(), "line 2: unknown request type (value not"),
        "extra.csv": (f"subject_id,type\n{email},erase,ccpa\n".encode(), "line 2: expected 2 fields"),
        "when.csv": (f"subject_id,type,received_at\n{email},erase,{email}\n".encode(), "is not an ISO-8601"),
        "[red]/r.csv": (b"subject_id,type\nu1,delete\n", "[red]/r.csv line 2: unknown request type 'delete'"),
        "[/x].csv": (None, "[/x].csv does not exist"),  # file names are not Rich markup
    }
    for name, (content, message) in files.items():
        if content is not None:
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_bytes(content)
        code, out, err = dsr_in_process(monkeypatch, capsys, "-c", str(config), "submit", "--file",
                                        str(tmp_path / name))
        assert code == 2 and message in err and err.startswith("error:"), (name, err)
        assert email not in err + out and "Traceback" not in err
    code, _, err = dsr_in_process(monkeypatch, capsys, "-c", str(config), "submit", "--file", str(tmp_path))
    assert code == 2 and "cannot be read: Is a directory" in err
    code, _, err = dsr_in_process(monkeypatch, capsys, "-c", str(config), "submit", "--subject", email, "--type",
                                  "erase", "--received", "9999-12-31")
    assert code == 2 and "received_at 9999-12-31T00:00:00+00:00 is in the future" in err
    assert snapshot_ids(spark, settings, TABLES) == before

    subject = HOSTILE[0]
    write_csv(tmp_path / "dups.csv", [["subject_id", "type", "regulation"], [subject, "erase", ""],
                                      [subject, " ERASE", "gdpr"], [subject, "erase", "ccpa"], [subject, "access", ""]])
    code, out, err = dsr_in_process(monkeypatch, capsys, "-c", str(config), "submit", "--file",
                                    str(tmp_path / "dups.csv"))
    assert code == 0 and "2 request(s) submitted, 2 duplicate(s) of open requests ignored" in out, err
    again = Ledger(settings).submit(read_requests_csv(tmp_path / "dups.csv"))
    assert again.created == [] and again.duplicates == 4  # the open ones are not added twice either


@pytest.mark.slow  # a full run / real processes: make test-slow
def test_cli_exit_codes_in_a_real_process(tmp_path):
    """The only two subprocesses: bytes no text decoding gives, and a catalog nobody listens for."""
    plain = write_config(settings_from_dict({"secret_key_file": str(tmp_path / "k")}, base=tmp_path),
                         tmp_path / "plain.yaml")
    result = subprocess.run([str(DSR), "-c", str(plain), "submit", "--subject", b"cust-\xff\xfe42", "--type", "erase"],
                            cwd=tmp_path, capture_output=True, timeout=120)
    err = words(result.stderr.decode(errors="replace"))
    assert result.returncode == 2 and "subject id is not valid Unicode text" in err, err
    assert b"cust-" not in result.stderr and "Traceback" not in err

    offline = tmp_path / "offline.yaml"
    offline.write_text(yaml.safe_dump(unreachable(tmp_path)))
    result = subprocess.run([str(DSR), "-c", str(offline), "submit", "--subject", HOSTILE[2], "--type", "erase"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    err = words(result.stderr)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: catalog offline cannot be reached:" in err and "Connection refused" in err, err
    assert "Traceback" not in err and HOSTILE[2] not in result.stdout + result.stderr
