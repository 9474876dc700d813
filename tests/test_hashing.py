import os
import stat

import pytest

from lakehouse_dsr.exceptions import ConfigError
from lakehouse_dsr.hashing import keyed_hash, load_key, with_keyed_hash

VALUES = ["alice", "x' OR '1'='1", "%", "\u00e9l\u00e8ve \U0001f600", "a\x00b", " ", "k" * 10_000]


@pytest.mark.parametrize("key", [b"short key", os.urandom(32), os.urandom(100)])
def test_spark_hmac_equals_python_hmac(spark, key):
    df = spark.createDataFrame([(v,) for v in VALUES], "v string")
    got = {r.v: r.key_hash for r in with_keyed_hash(spark, df, "v", key).collect()}
    assert got == {v: keyed_hash(key, v) for v in VALUES}


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
