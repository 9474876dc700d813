"""The evidence of retention (stages/retention.py) as typed models, in a module without Spark: the
run report's models (evidence/models.py) are read by the control plane, which never imports PySpark.
They hold counts, dates and rule texts, never an identifier."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleExpiry(_Model):
    """One rule of one table in one pass."""

    rule: str = Field(description="the rule in words: its action, period and clock column")
    cutoff: str = Field(description="rows whose clock is before this day (00:00 UTC) are past the rule")
    rows_past: int = Field(description="rows past the rule before this pass (redact: those not redacted yet)")
    snapshot_id: int | None = Field(None, description="the commit that deleted or redacted them")
    data_files_deleted: int = Field(0, description="data files the commit removed (whole or to rewrite them)")
    data_files_added: int = Field(0, description="data files the commit wrote (rewritten rows)")
    delete_files_added: int = Field(0, description="delete files or deletion vectors the commit wrote")
    metadata_only: bool = Field(False, description="whole data files dropped, none written: nothing rewritten")
    rows_left: int | None = Field(None, description="live rows still past the rule afterwards (the proof; null: "
                                                    "dry run)")
    seconds: float = 0.0


RefOutcome = Literal["clean", "kept", "blocked", "dropped", "rewritten"]


class RefExpiry(_Model):
    """One branch or tag of a table in one pass of retention (`purge.pinned_refs` decides)."""

    rows_past: int = Field(description="rows past a rule in the ref's snapshot before this pass (read with the "
                                       "rules' predicates as of that snapshot)")
    outcome: RefOutcome = Field(
        description="clean: pins no row past a rule, left alone; blocked: pins some and pinned_refs is block, so "
        "the table was not expired; dropped: a tag pinning some, dropped (pinned_refs: drop); rewritten: a branch "
        "expired in place (the rules committed on it), or a tag re-pointed to a cleaned copy of its snapshot "
        "(pinned_refs: rewrite); kept: left as it was (not checked by the purge). A dry run: what would be")
    snapshot_id: int | None = Field(None, description="the ref's snapshot after the pass (null: dropped)")
    rows_left: int | None = Field(None, description="rows past a rule in that snapshot afterwards (the proof; "
                                                    "null: not read, as for a ref left alone)")


class TableExpiry(_Model):
    """A table's retention in one pass: each rule, the purge and the proof."""

    rules: list[RuleExpiry]
    refs: dict[str, RefExpiry] = Field(default_factory=dict, description="each branch and tag (`tag audit_q3`, "
                                       "`branch staging`) -> whether it pinned rows past a rule and what was done")
    blocked: str | None = Field(None, description="why the table was not expired: branches or tags pin rows past "
                                                  "a rule and purge.pinned_refs is block (nothing committed)")
    purge: dict[str, Any] | None = Field(None, description="the physical purge (as erasure's), when a rule committed")
    history: int | None = Field(None, description="rows past a rule in files of retained snapshots (null: not "
                                                  "checked, nothing committed)")
    storage: int | None = Field(None, description="rows past a rule in any file under the table's location")
    one_scan: bool = Field(False, description="history and storage held only the live files: the live count "
                                              "proved them")
    passed: bool = Field(description="no row past a rule found where it was looked for (false when blocked)")
    error: str | None = None


class RetentionPass(_Model):
    """What one pass of retention (a `dsr run` stage, or `dsr expire`) did: no identifier, counts only."""

    run_id: str
    dry_run: bool = Field(description="nothing was changed: what would be")
    today: str = Field(description="the run's date the cutoffs are computed from")
    tables: dict[str, TableExpiry]
    skipped: dict[str, str] = Field(description="tables not expired -> why: a legal hold on the table or on a "
                                                "person whose rows past a rule it holds, a collateral hold")
    subject_holds: int = Field(description="active subject holds: a table holding a held person's rows past a "
                                           "rule is skipped (see `skipped`)")
    passed: bool


class SnapshotHolding(_Model):
    """A retained snapshot referencing a data file that holds a row past a rule."""

    snapshot_id: int
    committed_at: str = Field(description="when it was committed (ISO-8601, UTC)")
    refs: list[str] = Field(default_factory=list, description="branches and tags pointing at it (main: the "
                                                              "current snapshot)")


class RuleStatus(_Model):
    rule: str
    cutoff: str = Field(description="rows whose clock is before this day are past the rule today")
    oldest: str | None = Field(description="the oldest clock value in live data (ISO-8601; null: no row; a clock "
                                           "of the subject: the oldest subject clock of a live row)")
    rows_past: int = Field(description="live rows past the rule today (redact: not redacted yet)")
    bytes_past_estimate: int = Field(0, description="bytes of live data files holding the rows past, each file "
                                     "counted for its share of rows past (file size x rows past / rows in the "
                                     "file): exact for files wholly past (whole partitions of a table partitioned "
                                     "by the clock), an estimate for files straddling the cutoff")
    oldest_snapshot_holding: SnapshotHolding | None = Field(
        None, description="the oldest retained snapshot referencing a data file that holds a row past the rule, "
        "deleted or not (read from the files; null: none does, as after a run's purge)")
    next_crossing: str | None = Field(description="the first day more rows pass the rule (null: none left)")
    cleared_by: str = Field(description="what clears the rows past: the next dsr run, a hold, or nothing to clear")


class TableStatus(_Model):
    rules: list[RuleStatus]
    held: str | None = Field(None, description="the legal hold that keeps retention from this table")
    oldest_snapshot_at: str | None = Field(description="when the oldest retained snapshot was committed: files it "
                                                       "references may hold rows past a rule until the next purge")
    snapshots: int = Field(description="snapshots the table retains")


class RetentionStatus(_Model):
    today: str
    tables: dict[str, TableStatus]
    subject_holds: int = Field(description="active subject holds: a table holding a held person's rows past a "
                                           "rule is skipped")
    kept_longer: dict[str, str] = Field(default_factory=dict, description="derived tables that keep people's rows "
                                        "longer than a source deletes them (through lineage) -> why")
