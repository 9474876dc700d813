"""The table-format seam: row counts read from commit metadata must equal real counts."""

from __future__ import annotations

import pytest

from lakehouse_dsr.lake.lakehouse import Lake

_MOR = "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read'"
_COW = "'write.delete.mode'='copy-on-write', 'write.update.mode'='copy-on-write'"
MODES = {
    "v2 merge-on-read": f"'format-version'='2', {_MOR}",
    "v3 deletion vectors": f"'format-version'='3', {_MOR}",
    "v2 copy-on-write": f"'format-version'='2', {_COW}",
}


@pytest.mark.parametrize("mode", list(MODES))
def test_rows_after_commit_equals_a_count(spark, new_lakehouse, mode):
    settings = new_lakehouse(users=4, events=10)
    name = settings.table("demo.counted")
    spark.sql(f"CREATE TABLE {name} (id int, v string) USING iceberg TBLPROPERTIES ({MODES[mode]})")
    spark.range(100).selectExpr("cast(id as int) id", "cast(id as string) v").coalesce(1).writeTo(name).append()
    # Two deletes in the same file (a second deletion vector replaces the first), then an update.
    for statement in (f"DELETE FROM {name} WHERE id < 10", f"DELETE FROM {name} WHERE id BETWEEN 10 AND 24",
                      f"UPDATE {name} SET v = NULL WHERE id > 90"):
        before = spark.table(name).count()
        spark.sql(statement)
        commit = Lake.of(spark, settings).table("demo.counted").current_snapshot().snapshot_id
        assert Lake.of(spark, settings).table("demo.counted").rows_after_commit(commit, before) == \
            spark.table(name).count(), statement
    assert spark.table(name).count() == 75
