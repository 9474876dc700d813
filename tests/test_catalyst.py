"""The version shim's cast (lake/catalyst.py): a request's identifier that cannot be a key column's
type matches nothing, under either ANSI setting and on either Spark line (3.5 builds the TRY cast
itself; a plain cast under ANSI fails the job and prints the value)."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType

from helpers import conf_kept
from lakehouse_dsr.stages.matching import keys_for_identifier


@pytest.mark.parametrize("ansi", ["true", "false"])
@pytest.mark.parametrize("key_type", [LongType(), IntegerType()])
def test_an_identifier_that_cannot_be_the_keys_type_matches_nothing_under_either_ansi_setting(spark, ansi, key_type):
    keys = spark.createDataFrame([("r1", "user_id", "u1"), ("r2", "user_id", "42"), ("r3", "user_id", None),
                                  ("r4", "email", "7")], "request_id string, key_type string, key_value string")
    with conf_kept(spark, ["spark.sql.ansi.enabled"]):
        spark.conf.set("spark.sql.ansi.enabled", ansi)
        found = keys_for_identifier(keys, "user_id", key_type)
        assert found.schema["key_value"].dataType == key_type
        assert sorted(tuple(r) for r in found.collect()) == [("r2", 42)]
        # a plain cast of the same rows fails under ANSI: the case the shim is for
        plain = keys.where("key_type = 'user_id'").select(F.col("key_value").cast(key_type))
        if ansi == "true":
            with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
                plain.collect()
