import os
import stat

import pytest
from typer.testing import CliRunner

from lakehouse_dsr.cli import app
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.exceptions import ConfigError
from lakehouse_dsr.keys import (
    Keyring,
    key_id,
    keyed_hash,
    load_key,
    load_retired,
    retired_file,
    rotate_key,
)
from lakehouse_dsr.lake.hmac import join_on_key, with_keyed_hash, with_keyring_hashes
from lakehouse_dsr.lake.indriver import local_rows
from lakehouse_dsr.lake.metrics import StageMeter

VALUES = ["alice", "x' OR '1'='1", "%", "\u00e9l\u00e8ve \U0001f600", "a\x00b", " ", "k" * 10_000]


@pytest.mark.parametrize("key", [b"", b"short key", os.urandom(64), os.urandom(65), os.urandom(100)],
                         ids=["empty", "short", "64-bytes", "65-bytes", "100-bytes"])
def test_keyed_hash_is_the_standard_hmac_sha256(key):
    """keyed_hash reuses each key's padded states: the result is still RFC 2104's, key lengths past the
    block size (hashed first) included."""
    import hmac

    assert [keyed_hash(key, v) for v in VALUES] == [hmac.new(key, v.encode(), "sha256").hexdigest() for v in VALUES]


@pytest.mark.parametrize("key", [b"short key", os.urandom(32), os.urandom(100)], ids=["short", "32-bytes", "100-bytes"])
@pytest.mark.parametrize("held", ["spark", "driver"])
def test_spark_hmac_equals_python_hmac(spark, key, held):
    rows = [(v, i) for i, v in enumerate(VALUES)] + [(None, 2**40)]
    schema = "v string, n bigint"
    # a Python RDD is hashed by Spark; a local relation (a batch's identifiers) in the driver, without a job
    df = spark.createDataFrame(rows, schema) if held == "spark" else local_rows(spark, rows, schema)
    meter = StageMeter(spark)
    mark = meter.mark()
    got = {r.v: r.key_hash for r in with_keyed_hash(spark, df, "v", key).collect()}
    assert got == {v: keyed_hash(key, v) for v in VALUES} | {None: None}
    assert (meter.since(mark).stages == 0) == (held == "driver")
    # a column that is not text is hashed as Spark's cast writes it, the other columns kept
    by_number = {tuple(r)[:2]: r.key_hash for r in with_keyed_hash(spark, df, "n", key).collect()}
    assert by_number == {(v, n): keyed_hash(key, str(n)) for v, n in rows}
    ring = {"k1": key, "k2": b"other"}
    hashed = with_keyring_hashes(spark, df.where("v IS NOT NULL"), "v", ring).collect()
    assert {(r.v, r.key_id): r.key_hash for r in hashed} == \
        {(v, k): keyed_hash(ring[k], v) for v in VALUES for k in ring}


def test_key_plan_does_not_show_the_key(spark):
    key = b"very-secret-key-material"
    df = with_keyed_hash(spark, spark.createDataFrame([("a",)], "v string"), "v", key)
    plan = df._jdf.queryExecution().toString()
    assert key.hex() not in plan and "very-secret" not in plan


def test_key_file_created_owner_only(tmp_path, monkeypatch):
    monkeypatch.delenv("DSR_SECRET_KEY", raising=False)
    path = tmp_path / "k" / "dsr-secret.key"
    key = load_key(path)
    assert len(key) == 32 and load_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_key(path)


def test_key_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DSR_SECRET_KEY", "from-env")
    assert load_key(tmp_path / "unused") == b"from-env"
    assert not (tmp_path / "unused").exists()


def _key_settings(tmp_path):
    return settings_from_dict({"secret_key_file": str(tmp_path / "dsr-secret.key")}, base=tmp_path)


def test_rotation_retires_the_old_key_owner_only(tmp_path, monkeypatch):
    monkeypatch.delenv("DSR_SECRET_KEY", raising=False)
    settings = _key_settings(tmp_path)
    with pytest.raises(ConfigError, match="nothing to rotate"):
        rotate_key(settings.key_file())
    first = load_key(settings.key_file())
    one = rotate_key(settings.key_file())
    second = load_key(settings.key_file())
    two = rotate_key(settings.key_file())
    third = load_key(settings.key_file())
    retired = retired_file(settings.key_file())
    assert len({first, second, third}) == 3 and len(third) == 32
    assert (one.old_id, one.new_id, two.old_id, two.new_id) == (key_id(first), key_id(second), key_id(second),
                                                                 key_id(third))
    assert retired.read_text() == f"{first.hex()}\n{second.hex()}\n" and two.retired == 2
    assert {stat.S_IMODE(p.stat().st_mode) for p in (settings.key_file(), retired)} == {0o600}
    ring = Keyring(third, load_retired(settings.key_file()))
    assert list(ring.keys()) == [key_id(third), key_id(second), key_id(first)]  # active, then newest retired
    assert not list(tmp_path.glob("*.tmp"))


def test_rotation_interrupted_after_retiring_does_not_retire_twice(tmp_path, monkeypatch):
    monkeypatch.delenv("DSR_SECRET_KEY", raising=False)
    settings = _key_settings(tmp_path)
    key = load_key(settings.key_file())
    retired = retired_file(settings.key_file())
    fd = os.open(retired, os.O_WRONLY | os.O_CREAT, 0o600)  # the old key is in the keyring, the key file unchanged
    os.write(fd, key.hex().encode())  # no trailing newline (edited by hand)
    os.close(fd)
    rotate_key(settings.key_file())
    assert retired.read_text() == key.hex() and load_key(settings.key_file()) != key  # not retired twice
    second = load_key(settings.key_file())
    rotate_key(settings.key_file())
    assert retired.read_text() == f"{key.hex()}\n{second.hex()}\n"


def test_keyring_file_must_be_owner_only_and_hex(tmp_path, monkeypatch):
    monkeypatch.delenv("DSR_SECRET_KEY", raising=False)
    settings = _key_settings(tmp_path)
    load_key(settings.key_file())
    retired = retired_file(settings.key_file())
    retired.write_text("00ff\n")
    retired.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_retired(settings.key_file())
    retired.chmod(0o600)
    assert load_retired(settings.key_file()) == (b"\x00\xff",)
    retired.write_text("00ff\n\nnot hex\n")
    with pytest.raises(ConfigError, match="line 3 is not a hex key"):
        rotate_key(settings.key_file())


def test_rotation_refuses_a_key_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DSR_SECRET_KEY", "from-env")
    with pytest.raises(ConfigError, match="DSR_SECRET_KEY"):
        rotate_key(_key_settings(tmp_path).key_file())


def test_rotate_key_command(tmp_path, monkeypatch):
    monkeypatch.delenv("DSR_SECRET_KEY", raising=False)
    config = tmp_path / "dsr.yaml"
    config.write_text(f"secret_key_file: {tmp_path / 'k' / 'dsr-secret.key'}\n")
    load_key(tmp_path / "k" / "dsr-secret.key")
    result = CliRunner().invoke(app, ["-c", str(config), "rotate-key"])
    assert result.exit_code == 0, result.output
    assert "is now active" in result.output and "retired to" in result.output
    assert (tmp_path / "k" / "dsr-secret.key.retired").stat().st_mode & 0o077 == 0


def test_each_hash_is_checked_under_the_key_that_made_it(spark):
    old, new = b"old key", b"new key"
    ring = Keyring(new, (old,))
    df = spark.createDataFrame([(v,) for v in VALUES[:4]], "v string")
    got = {(r.v, r.key_id): r.key_hash for r in with_keyring_hashes(spark, df, "v", ring.keys()).collect()}
    assert got == {(v, key_id(k)): keyed_hash(k, v) for v in VALUES[:4] for k in (old, new)}
    stored = spark.createDataFrame(
        [("made-by-old", keyed_hash(old, "alice"), key_id(old)),
         ("wrong-key-id", keyed_hash(old, "%"), key_id(new)),  # a hash compared only with its own key's candidates
         ("legacy", keyed_hash(old, VALUES[3]), None)],        # NULL key id: any key of the ring
        "request_id string, key_hash string, key_id string")
    candidates = with_keyring_hashes(spark, df, "v", ring.keys())
    assert sorted(r.request_id for r in join_on_key(candidates, stored).collect()) == ["legacy", "made-by-old"]
    assert sorted(r.v for r in join_on_key(candidates, stored, "left_semi").collect()) == ["alice", VALUES[3]]


def test_first_use_from_many_threads_makes_one_key(tmp_path):
    """Processes or threads starting together on a fresh install all get the one key that was written."""
    from concurrent.futures import ThreadPoolExecutor

    from lakehouse_dsr.keys import load_key

    path = tmp_path / "dsr-secret.key"
    with ThreadPoolExecutor(16) as pool:
        keys = set(pool.map(lambda _: load_key(path), range(64)))
    assert len(keys) == 1 and len(next(iter(keys))) == 32
    assert path.stat().st_mode & 0o777 == 0o600 and [p.name for p in tmp_path.iterdir()] == [path.name]
