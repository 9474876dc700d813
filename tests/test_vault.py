"""The vault: pseudonymize, re-identify, shred, access through the vault, master-key rotation, with
real Spark and Iceberg tables, checked with pyarrow reading every stored file."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from pyspark.sql import functions as F

from helpers import SEED, datamap_dict, dsr_run, make_disk_lakehouse, make_settings, rows_of
from lakehouse_dsr import synth
from lakehouse_dsr.datamap.model import DataMap, demo_datamap
from lakehouse_dsr.exceptions import ConfigError, DataMapError
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.keys import keyed_hash, load_key
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages.access import UNLINKABLE_NOTE
from lakehouse_dsr.vault import vault
from lakehouse_dsr.vault.keys import VAULT_KEY_ENV, master_key_file
from lakehouse_dsr.vault.pseudonymize import VaultError, pseudonymize, pseudonymize_table, reidentify

EVENTS = "demo.events_vault"
USERS = "demo.users_vault"


def _stored_values(spark, settings, table: str) -> set:
    """Every string and binary value of every Parquet file under a table's location (pyarrow, no Iceberg)."""
    lake = Lake.of(spark, settings)
    root = Path(lake.table(table).location().removeprefix("file:"))
    values = set()
    for path in root.rglob("*.parquet"):
        for column in pq.read_table(path).columns:
            values.update(v for v in column.to_pylist() if isinstance(v, str | bytes))
    return values


def _holds(values: set, needle: str) -> bool:
    raw = needle.encode()
    return any(needle in v if isinstance(v, str) else raw in v for v in values)


def _shred_settings(settings, table_format: str = "iceberg", **extra):
    dm = datamap_dict(settings.datamap)
    dm["tables"][EVENTS] = {"key": "user_id", "action": "shred", "encrypted": ["event_details"],
                            "format": table_format, **extra}
    return make_settings(Path(settings.key_file()).parent, catalog=settings.catalog.model_dump(), datamap=dm,
                         purge={"orphan_min_age_minutes": 0})


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("vault"))
    attach(spark, settings)
    synth.generate(spark, settings, users=30, events=400, seed=SEED, batches=2)
    users = pseudonymize_table(spark, settings, "demo.users", USERS, "user_id", encrypt=["email", "name"])
    events = pseudonymize_table(spark, settings, "demo.events", EVENTS, "user_id", encrypt=["event_details"])
    return {"settings": settings, "users": users, "events": events}


def test_pseudonymized_tables_hold_no_plaintext(spark, lake):
    settings = lake["settings"]
    assert (lake["users"].rows, lake["users"].entries_created) == (30, 30)
    assert lake["events"].entries_created == 0  # the same people: their entries exist already
    assert lake["users"].datamap_entry() == {USERS: {"key": "user_id", "identifier": "user_id", "action": "shred",
                                                     "encrypted": ["email", "name"]}}
    users = spark.table(settings.table("demo.users")).collect()
    events = spark.table(settings.table("demo.events")).select("event_details").distinct().collect()
    stored = {t: _stored_values(spark, settings, t) for t in (USERS, EVENTS, vault.table_name(settings))}
    for user in users:
        for table in stored:
            assert not _holds(stored[table], user.user_id)
        for value in (user.email, user.name):
            assert not _holds(stored[USERS], value)
    assert not any(_holds(stored[EVENTS], e.event_details) for e in events)
    schema = dict(spark.table(settings.table(USERS)).dtypes)
    assert (schema["user_id"], schema["email"], schema["name"]) == ("string", "binary", "binary")


def test_reidentify_round_trips_and_pseudonyms_are_stable(spark, lake):
    settings = lake["settings"]
    for source, target, columns in (("demo.users", USERS, ["email", "name"]),
                                    ("demo.events", EVENTS, ["event_details"])):
        back = reidentify(spark.table(settings.table(target)), settings, "user_id", decrypt=columns)
        plain = spark.table(settings.table(source))
        assert rows_of(back) == rows_of(plain.select(*back.columns))
    again = pseudonymize(spark.table(settings.table("demo.users")), settings, "user_id")
    first = spark.table(settings.table(USERS)).select("user_id", "created_at")
    assert not rows_of(again.select("user_id", "created_at")) - rows_of(first)  # same pseudonym per person
    assert vault.rows(spark, settings).count() == 30
    pseudonyms = [r.user_id for r in first.collect()]
    assert len(set(pseudonyms)) == 30 and all(p.startswith("psn:") for p in pseudonyms)


@pytest.mark.parametrize("encrypt, message", [(["nope"], "does not exist"), (["user_id"], "is the key column"),
                                              (["created_at"], "only string or binary")])
def test_bad_encrypt_columns_are_refused_and_nothing_is_written(spark, lake, encrypt, message):
    settings = lake["settings"]
    before = Lake.of(spark, settings).table(vault.table_name(settings)).current_snapshot().snapshot_id
    with pytest.raises(DataMapError, match=message):
        pseudonymize_table(spark, settings, "demo.users", "demo.users_bad", "user_id", encrypt=encrypt)
    assert not spark.catalog.tableExists(f"{settings.catalog.name}.demo.users_bad")
    assert Lake.of(spark, settings).table(vault.table_name(settings)).current_snapshot().snapshot_id == before


def test_a_pseudonym_with_no_entry_is_an_error(spark, lake):
    settings = lake["settings"]
    forged = spark.createDataFrame([("psn:00000000-0000-4000-8000-000000000000", "x")], "user_id string, v string")
    with pytest.raises(VaultError, match="no vault entry"):
        reidentify(forged, settings, "user_id")
    assert reidentify(forged, settings, "user_id", unlinkable="drop").count() == 0


def test_a_wrong_or_missing_master_key_changes_nothing(spark, lake, monkeypatch):
    settings = lake["settings"]
    before = Lake.of(spark, settings).table(vault.table_name(settings)).current_snapshot().snapshot_id
    monkeypatch.setenv(VAULT_KEY_ENV, "ab" * 32)
    with pytest.raises(ConfigError, match="wrong vault master key"):
        pseudonymize_table(spark, settings, "demo.orders", "demo.orders_vault", "user_id")
    monkeypatch.setenv(VAULT_KEY_ENV, "not hex")
    with pytest.raises(ConfigError, match="not hex"):
        reidentify(spark.table(settings.table(USERS)), settings, "user_id")
    monkeypatch.delenv(VAULT_KEY_ENV)
    key = master_key_file(settings)
    hidden = key.with_name("moved-away.key")
    key.rename(hidden)
    try:
        with pytest.raises(ConfigError, match="no vault master key"):
            pseudonymize_table(spark, settings, "demo.orders", "demo.orders_vault", "user_id")
        assert not key.exists()  # a vault with entries never gets a new key
    finally:
        hidden.rename(key)
    assert not spark.catalog.tableExists(f"{settings.catalog.name}.demo.orders_vault")
    assert Lake.of(spark, settings).table(vault.table_name(settings)).current_snapshot().snapshot_id == before


def test_shred_tables_are_checked_against_the_catalog(spark, lake):
    settings = lake["settings"]
    dm = datamap_dict(demo_datamap(derived=False))
    dm["tables"]["demo.events"] = {"key": "user_id", "action": "shred"}  # plaintext ids, not pseudonyms
    dm["tables"][EVENTS] = {"key": "user_id", "action": "shred", "quasi_identifiers": ["nope"], "min_k": 3}
    with pytest.raises(DataMapError) as caught:
        check_against_catalog(spark, DataMap.model_validate(dm), settings.table)
    assert "demo.events: " in str(caught.value) and "are not vault pseudonyms" in str(caught.value)
    assert "no column 'nope'" in str(caught.value)
    for bad in ({"keys": {"user_id": {}}, "action": "shred"}, {"key": "user_id", "min_k": 3},
                {"key": "user_id", "action": "shred", "min_k": 3}):
        with pytest.raises(ValueError):
            DataMap.model_validate({"tables": {EVENTS: bad}})


def test_a_shred_table_mapped_without_the_columns_pseudonymize_encrypted_is_refused(spark, lake):
    settings = lake["settings"]
    dm = datamap_dict(demo_datamap(derived=False))
    dm["tables"][EVENTS] = {"key": "user_id", "action": "shred"}  # pseudonymize encrypted event_details
    dm["tables"][USERS] = {"key": "user_id", "action": "shred", "encrypted": ["email"]}  # and name
    with pytest.raises(DataMapError) as caught:
        check_against_catalog(spark, DataMap.model_validate(dm), settings.table)
    message = " ".join(str(caught.value).split())
    assert f"table {EVENTS}: dsr pseudonymize encrypted column(s) event_details " in message
    assert f"table {USERS}: dsr pseudonymize encrypted column(s) name " in message
    assert "would deliver them as ciphertext" in message
    dm["tables"][EVENTS]["encrypted"], dm["tables"][USERS]["encrypted"] = ["event_details"], ["email", "name"]
    check_against_catalog(spark, DataMap.model_validate(dm), settings.table)  # named: accepted


def _hash(settings, value: str) -> str:
    return keyed_hash(load_key(settings.key_file()), value)


@pytest.mark.slow
@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_shred_erases_through_the_vault_and_access_reads_through_it(spark, tmp_path, table_format):
    """The shredded copy an Iceberg or a Delta table (the vault is always the engine's Iceberg table)."""
    settings, _ = make_disk_lakehouse(spark, tmp_path)
    made = pseudonymize_table(spark, settings, "demo.events", EVENTS, "user_id", encrypt=["event_details"],
                              table_format=table_format)
    assert made.datamap_entry()[EVENTS].get("format", "iceberg") == table_format
    settings = _shred_settings(settings, table_format)
    erased, kept = synth.user_id(SEED, 1), synth.user_id(SEED, 2)
    values = spark.createDataFrame([(erased,), (kept,)], "value string")
    link = vault.links(spark, settings, values, "user_id", vault.open_keys(spark, settings)).collect()
    pseudonym = {r.value: r.pseudonym for r in link}
    table_before = Lake.of(spark, settings).table(EVENTS).current_snapshot().snapshot_id
    rows_before = spark.table(settings.table(EVENTS)).where(F.col("user_id") == pseudonym[erased]).count()
    assert rows_before > 0

    ledger = Ledger(settings)
    access_id, erase_id = ledger.submit([RequestInput(kept, "access"), RequestInput(erased, "erase")]).created
    report = run(spark, settings)
    assert {r.request_id: r.status for r in report.requests} == {access_id: "completed", erase_id: "completed"}
    entry = report.tables[EVENTS]
    assert entry["erase"]["action"] == "shred" and entry["erase"]["rows_changed"] == 0
    assert entry["verification"]["details"]["vault_entries_deleted"] == 1
    details = entry["verification"]["details"]
    assert details["table_snapshot_unchanged"] and details["files_read_for_plaintext"] == 0
    assert details["rows_kept"] == spark.table(settings.table(EVENTS)).count()
    assert entry["purge"]["snapshots_expired"] >= 1

    # The table was not rewritten: its rows under the pseudonym are all there.
    assert Lake.of(spark, settings).table(EVENTS).current_snapshot().snapshot_id == table_before
    left = spark.table(settings.table(EVENTS)).where(F.col("user_id") == pseudonym[erased])
    assert left.count() == rows_before
    # ... and no key the vault holds decrypts them (every entry's data key tried on every row).
    keys = vault.unwrapped(spark, settings, vault.open_keys(spark, settings)).select("data_key", "pseudonym")
    assert keys.count() == 39
    tried = left.crossJoin(keys.withColumnRenamed("pseudonym", "p")).select(
        vault.gcm_decrypt(F.col("event_details"), F.col("data_key"), F.col("user_id")).alias("plain"))
    assert tried.where(F.col("plain").isNotNull()).count() == 0
    # The entry is gone from the vault's live rows, its snapshots and its files.
    gone = {_hash(settings, erased), pseudonym[erased]}
    assert not gone & {v for r in vault.rows(spark, settings).collect() for v in (r.key_hash, r.pseudonym)}
    for snapshot in spark.sql(f"SELECT snapshot_id FROM {settings.table(vault.table_name(settings))}.snapshots"
                              ).collect():
        at = vault.rows(spark, settings, snapshot.snapshot_id).collect()
        assert not gone & {v for r in at for v in (r.key_hash, r.pseudonym)}
    stored = _stored_values(spark, settings, vault.table_name(settings))
    assert not any(_holds(stored, g) for g in gone) and _holds(stored, pseudonym[kept])
    # Other people still decrypt; the shredded one's rows are unlinkable.
    plain = spark.table(settings.table("demo.events"))
    back = reidentify(spark.table(settings.table(EVENTS)), settings, "user_id", ["event_details"], unlinkable="drop")
    assert rows_of(back) == rows_of(plain.select(*back.columns))  # demo.events was erased too
    with pytest.raises(VaultError):
        reidentify(spark.table(settings.table(EVENTS)), settings, "user_id", ["event_details"])

    # The access package holds the kept person's rows re-identified and decrypted, equal to the source.
    package = json.loads((Path(report.export["directory"]) / f"{access_id}.json").read_text())
    assert "unlinkable" not in package
    # (demo.events, exported directly, is the source the pseudonymized copy was made from)
    via_vault = sorted(json.dumps(r, sort_keys=True) for r in package["tables"][EVENTS])
    direct = sorted(json.dumps(r, sort_keys=True) for r in package["tables"]["demo.events"])
    assert via_vault == direct and len(direct) > 0

    # An access request for the shredded person: the table's leftovers are reported as unlinkable.
    late_id = ledger.submit([RequestInput(erased, "access")]).created[0]
    report = run(spark, settings)
    package = json.loads((Path(report.export["directory"]) / f"{late_id}.json").read_text())
    assert package["tables"][EVENTS] == [] and package["unlinkable"] == {EVENTS: UNLINKABLE_NOTE}


@pytest.mark.slow
def test_min_k_keeps_a_shred_from_counting_as_an_erasure(spark, tmp_path):
    settings, _ = make_disk_lakehouse(spark, tmp_path)
    pseudonymize_table(spark, settings, "demo.events", EVENTS, "user_id")
    settings = _shred_settings(settings, encrypted=[], quasi_identifiers=["event_type", "product_id"], min_k=1000)
    request_id = Ledger(settings).submit([RequestInput(synth.user_id(SEED, 3), "erase")]).created[0]
    report = run(spark, settings)
    [result] = report.requests
    assert result.status == "failed" and "below min_k 1000" in result.reason and "generalise or drop" in result.reason
    assert report.tables[EVENTS]["verification"]["details"]["k_anonymity"]["min_k"] == 1000
    status = Ledger(settings).request(request_id)
    assert status.status == "failed" and "min_k" in status.status_reason


@pytest.mark.slow
def test_master_key_rotation_keeps_the_living_readable_and_the_shredded_not(spark, tmp_path):
    settings, _ = make_disk_lakehouse(spark, tmp_path)
    pseudonymize_table(spark, settings, "demo.users", USERS, "user_id", encrypt=["email"])
    settings = _shred_settings(settings)
    settings.datamap.tables.pop(EVENTS)
    dm = datamap_dict(settings.datamap)
    dm["tables"][USERS] = {"key": "user_id", "action": "shred", "encrypted": ["email"]}
    settings = make_settings(Path(settings.key_file()).parent, catalog=settings.catalog.model_dump(), datamap=dm,
                             purge={"orphan_min_age_minutes": 0})
    erased = synth.user_id(SEED, 4)
    Ledger(settings).submit([RequestInput(erased, "erase")])
    assert run(spark, settings).requests[0].status == "completed"
    old_id = vault.open_keys(spark, settings).masters.active_id
    rotation = vault.rotate_master_key(spark, settings)
    assert (rotation.old_id, rotation.entries_rewrapped, rotation.retired_dropped) == (old_id, 39, 1)
    assert {r.master_key_id for r in vault.rows(spark, settings).collect()} == {rotation.new_id}
    stored = _stored_values(spark, settings, vault.table_name(settings))
    assert old_id not in stored  # no file keeps an entry wrapped under the old key
    back = reidentify(spark.table(settings.table(USERS)), settings, "user_id", ["email"], unlinkable="drop")
    source = spark.table(settings.table("demo.users"))  # the plain table: the erased person went from it too
    assert not rows_of(back.select(*source.columns)) - rows_of(source)
    assert back.count() == 39 and spark.table(settings.table(USERS)).count() == 40
    assert os.stat(master_key_file(settings)).st_mode & 0o777 == 0o600


@pytest.mark.slow
@pytest.mark.parametrize("failpoint", ["before_shred", "during_shred", "after_shred"])
def test_a_run_killed_while_shredding_is_finished_by_the_next(spark, tmp_path, failpoint):
    settings, config = make_disk_lakehouse(spark, tmp_path)
    pseudonymize_table(spark, settings, "demo.events", EVENTS, "user_id", encrypt=["event_details"])
    settings = _shred_settings(settings)
    raw = yaml.safe_load(config.read_text())
    raw["datamap"] = datamap_dict(settings.datamap)
    config.write_text(yaml.safe_dump(raw))
    erased = synth.user_id(SEED, 5)
    request_id = Ledger(settings).submit([RequestInput(erased, "erase")]).created[0]
    assert dsr_run(config, failpoint) == -signal.SIGKILL
    assert dsr_run(config) == 0
    assert Ledger(settings).request(request_id).status == "completed"
    evidence = Ledger(settings).evidence([request_id])[request_id]
    assert evidence["tables"][EVENTS]["checks"] == {"live": True, "collateral": True, "history": True,
                                                      "storage": True}
    stored = _stored_values(spark, settings, vault.table_name(settings))
    assert not _holds(stored, _hash(settings, erased))
    assert len(spark.sql(f"SELECT * FROM {settings.table(vault.table_name(settings))}.snapshots").collect()) == 1


@pytest.mark.slow
def test_dsr_pseudonymize_prints_the_datamap_entry_and_refuses_bad_input(spark, tmp_path):
    import subprocess
    import sys

    settings, config = make_disk_lakehouse(spark, tmp_path)
    dsr = str(Path(sys.executable).parent / "dsr")

    def cli(*args):
        return subprocess.run([dsr, "-c", str(config), *args], capture_output=True, text=True, cwd=tmp_path)

    done = cli("pseudonymize", "demo.users", "--into", USERS, "--key", "user_id", "--encrypt", "email,name")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == {"datamap": {"tables": {USERS: {
        "key": "user_id", "identifier": "user_id", "action": "shred", "encrypted": ["email", "name"]}}}}
    again = cli("pseudonymize", "demo.users", "--into", USERS, "--key", "user_id")
    bad = cli("pseudonymize", "demo.users", "--into", "demo.other", "--key", "user_id", "--encrypt", "created_at")
    assert (again.returncode, bad.returncode) == (2, 2)
    assert "already exists" in again.stderr and "only string or binary" in bad.stderr
    assert synth.user_id(SEED, 0) not in again.stderr + bad.stderr
    assert not spark.catalog.tableExists(f"{settings.catalog.name}.demo.other")


@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_only_files_whose_key_bounds_are_not_all_pseudonyms_are_read_for_plaintext(spark, tmp_path, table_format):
    """The shred proof's file list: a file whose key statistics (on Delta, strings cut to 32 characters;
    pseudonyms are 40) prove every value a pseudonym or null is not read; a file with a plaintext key
    is, and so is a Parquet file on storage no version references."""
    settings = make_settings(tmp_path)
    attach(spark, settings)
    name = "shredded.keys"
    lake = Lake(spark, settings.catalog, delta={name: str(tmp_path / "delta" / "keys")} if table_format == "delta"
                else {})
    rows = [(f"psn:{uuid.UUID(int=i)}", i) for i in range(3)] + [(None, 9)]
    lake.create_table(name, spark.createDataFrame(rows, "user_id string, n int").coalesce(1), {})
    handle = lake.table(name)
    assert handle.files_not_within("user_id", "psn:") == []
    spark.sql(f"INSERT INTO {lake.quoted(name)} VALUES ('alice', 1)")
    (plain,) = handle.files_not_within("user_id", "psn:")
    assert pq.read_table(plain.removeprefix("file:"), columns=["user_id"]).column("user_id").to_pylist() == ["alice"]
    stray = Path(plain.removeprefix("file:")).with_name("stray.parquet")
    stray.write_bytes(Path(plain.removeprefix("file:")).read_bytes())
    assert sorted(Path(p.removeprefix("file:")).name for p in handle.files_not_within("user_id", "psn:")) == \
        sorted([Path(plain).name, "stray.parquet"])
