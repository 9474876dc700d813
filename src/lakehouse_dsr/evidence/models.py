"""The evidence documents as typed, versioned models: the run report (`dsr run --report`, the run
page) and each request's evidence (what the ledger keeps and certificates are made from).

`VERSION` is the documents' version: it changes when a field changes meaning or goes away (new
fields do not change it). `dsr schema` publishes their JSON Schemas (schemas/ in the repository).
The models forbid unknown fields, so a document that drifts from its schema fails where it is
made, not in a reader. None of them holds a subject identifier.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..ledger.records import RecordExpiry
from ..stages.retention_models import RetentionPass

VERSION = 1


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- a request's evidence ---------------------------------------------------------------------------

class Checks(_Document):
    """What the verification looked at for a table, each true when nothing of the subject was found
    there (absent: not checked in that run)."""

    live: bool = Field(description="the table's current snapshot")
    collateral: bool | None = Field(None, description="the erase commit changed no row nobody asked about")
    history: bool | None = Field(None, description="the files of every retained snapshot, branches and tags")
    storage: bool | None = Field(None, description="every file under the table's location")
    metadata: bool | None = Field(None, description="every value of the table's metadata files (a Delta log)")


class Proof(_Document):
    method: str = Field(description="how the table was proven, in words")
    passed: bool = Field(description="no check found this request's subject")
    one_scan: bool = Field(description="history and storage held only the live files: one scan proved all three")
    refs_checked: list[str] = Field(description="branches and tags whose snapshots were read")


class TableProof(_Document):
    """One table's (or share's) part of a request's evidence."""

    action: str | None = Field(None, description="delete, redact, recompute, shred; exclude/include for shares; "
                                               "keep for a table exempt from erasure")
    rows: int | None = Field(None, description="the subject's rows erased, redacted or taken out there")
    snapshot_id: int | None = Field(None, description="the commit that erased them")
    rounds: int | None = Field(None, description="erase rounds (more than one when rows arrived meanwhile)")
    erased_in_run: str | None = Field(None, description="an interrupted run that erased them")
    strategy: str | None = Field(None, description="how an aggregate was recomputed")
    refresh: str | None = Field(None, description="how a share was refreshed")
    purged: bool = Field(description="old snapshots and unreferenced files were removed")
    data_files_rewritten: int
    bytes_rewritten: int
    snapshots_expired: int
    files_deleted: int
    orphans_removed: int
    checks: Checks | None = None
    verification: Proof | None = None
    exempt: str | None = Field(None, description="the exemption from erasure the table is kept under (data map)")
    kept: bool | None = Field(None, description="the exempt table holds the subject's data, kept under the exemption")


class TopicProof(_Document):
    """A Kafka topic's part of a request's evidence (stages/topics.py)."""

    action: Literal["tombstone", "retention"] = Field(description="tombstone: record keys tombstoned for "
                                                      "compaction; retention: left to the topic's time retention")
    cleanup_policy: str
    retention_ms: int = Field(description="the topic's retention.ms (-1: kept forever)")
    tombstones: int = Field(description="record keys of the subject's latest records tombstoned by this run")
    records_left: int = Field(description="the subject's records read back from the earliest offset")
    records_read: int = Field(description="records the proof read")
    passed: bool = Field(description="no record of the subject is left in the topic")
    gone_by: str | None = Field(description="when the topic's settings guarantee the records left are gone (none: "
                                            "nothing removes them)")
    method: str = Field(description="how the topic was read and the subject looked for")
    accepted: str | None = Field(None, description="the data map's accepted reason for records left (accept_retention)")


class ErasureEvidence(_Document):
    """An erase request's evidence: per table what was done and how it was proven."""

    version: int = VERSION
    run_id: str
    verified_at: str
    tables: dict[str, TableProof]
    erased_in_run: str | None = Field(None, description="the earlier run that erased the subject (batched purge)")
    topics: dict[str, TopicProof] | None = Field(None, description="the data map's Kafka topics, as settled and read "
                                                 "back by this run")


class AccessEvidence(_Document):
    """An access request's evidence: its package and the manifest that holds its checksum."""

    version: int = VERSION
    run_id: str
    file: str | None = None
    sha256: str | None = None
    bytes: int | None = None
    rows: dict[str, int] | None = Field(None, description="rows exported per table")
    manifest: str | None = None


# -- the run report ---------------------------------------------------------------------------------

class Collateral(_Document):
    ok: bool
    conclusive: bool
    detail: str | None
    clean_files: int = Field(description="files the check read whole and found free of the batch")


class ErasureRecord(_Document):
    """A table's erase: its plan (strategy, rows, data skipping) and its commit."""

    table: str
    key: str
    identifier: str
    action: str
    strategy: str
    write_mode: str
    rows_before: int
    rows_matched: int
    snapshot_before: int | None
    reason: str | None
    rows_scanned: int | None
    skipping: dict[str, Any] | None = Field(description="files and bytes data skipping let the plan read")
    folded: bool = Field(default=False, description="the plan read no rows: the rewrite of every candidate file "
                                                    "counted the matches (rows_matched) as it read them")
    snapshot_id: int | None
    rows_after: int
    data_files_rewritten: int
    bytes_rewritten: int
    delete_files_added: int
    seconds: float
    error: str | None
    attempts: int
    rounds: int
    collateral: Collateral | None
    rows_changed: int


class PurgeRecord(_Document):
    table: str
    data_files_rewritten: int
    bytes_rewritten: int
    delete_files_removed: int
    manifests_rewritten: int
    snapshots_expired: int
    files_deleted: int
    orphans_removed: int
    refs_dropped: list[str] = Field(description="tags holding erased rows, dropped (pinned_refs: drop)")
    refs_kept: list[str] = Field(description="branches and tags left as they were (pinned_refs: block, or not checked)")
    refs_rewritten: list[str] = Field(
        default_factory=list, description="branches erased in place; tags re-pointed to a cleaned copy (rewrite)")
    refs_clean: list[str] = Field(default_factory=list,
                                  description="branches and tags holding no erased row, left alone")
    dangling_deletes_kept: bool
    seconds: float
    error: str | None


class VerificationRecord(_Document):
    table: str
    live: int = Field(description="rows of the batch's subjects in the current snapshot")
    history: int
    storage: int
    metadata: int = Field(0, description="values of the batch's subjects in the table's metadata files (a Delta "
                          "log's statistics and predicates); 0 for formats whose metadata holds none")
    refs: dict[str, int]
    physical: bool = Field(description="false: live data only (the purge is still scheduled)")
    one_scan: bool
    collateral_ok: bool
    collateral_detail: str | None
    details: dict[str, Any]
    seconds: float
    passed: bool
    requests_failing: int


class TableRecord(_Document):
    """A table's part of the run report (empty sections: the stage did not run there)."""

    aggregate: bool | None = None
    erase: ErasureRecord | dict[str, Any]
    purge: PurgeRecord | dict[str, Any]
    verification: VerificationRecord


class ShareRecord(_Document):
    share: str
    mode: str
    reason: str | None
    source_snapshot: int | None
    snapshot_id: int | None
    rows_added: int
    rows_removed: int
    data_files_added: int
    data_files_rewritten: int
    bytes_rewritten: int
    purge: PurgeRecord | dict[str, Any]
    verification: VerificationRecord | dict[str, Any]
    seconds: float
    error: str | None


class IoRecord(_Document):
    """Spark's counters over a stage."""

    stages: int
    tasks: int
    rows_read: int
    bytes_read: int
    rows_written: int
    bytes_written: int
    shuffle_bytes: int
    driver_files: int
    truncated: bool


class PurgeSchedule(_Document):
    policy: str
    purged: bool
    waiting: int = Field(description="requests logically erased, waiting for the batched purge")
    next_purge_by: str | None


class ExportSummary(_Document):
    directory: str
    manifest: str
    format: str
    packages: int
    rows: dict[str, int]


class RequestLine(_Document):
    request_id: str
    status: Literal["completed", "failed", "erased", "held"]
    reason: str | None


class Summary(_Document):
    requests: int
    completed: int
    failed: int
    awaiting_purge: int
    held: int = Field(0, description="erase requests a legal hold stops (status held)")
    seconds_total: float


class TableFigures(_Document):
    action: str
    rows: int
    files_rewritten: int
    bytes_rewritten: int
    snapshots_expired: int
    verified: Literal["yes", "live only", "no"]


class CommitRecord(_Document):
    snapshot_id: int | None = None
    operation: str | None = None
    sequence_number: int | None = Field(None, description="when the commit's snapshot has expired: its number")


class ResurrectionRecord(_Document):
    """People erased by earlier runs found again in a table, and erased again by this run."""

    rows: int = Field(description="rows holding an identifier of a completed erase request (a row found through "
                                  "two key columns counts twice)")
    requests: int = Field(description="completed erase requests whose subject came back")
    files: int = Field(description="data files holding them")
    commits: list[CommitRecord] = Field(description="the commits that added those files")
    files_read: int = Field(description="data files the check read: those added since the table's last check")
    whole_table: bool = Field(description="every live file was read (no usable checkpoint: first check, a "
                                          "rollback, a replaced table, format v1)")


class DropMatch(_Document):
    """California DROP work items matched against the lake (drop/matching.py): counts only."""

    items: int = Field(description="work items looked for: never matched, or found nobody before")
    one_person: int = Field(description="matched to one person: an erase request each")
    several_people: int = Field(description="matched to several people: each opted out of sale/sharing")
    not_found: int = Field(description="matched to nobody: DROP status 5, looked for again by the next run")
    erase_requests: int = Field(description="erase requests filed (a person matched twice gets one)")
    opt_out_requests: int = Field(description="opt-out requests filed")


class TopicRecord(_Document):
    """A Kafka topic as a run settled it for its erase batch (stages/topics.py): settings and counts."""

    cleanup_policy: str
    retention_ms: int
    max_compaction_lag_ms: int
    partitions: int
    records_read: int = Field(description="records read back from the earliest offset, for the proof")
    tombstones: int = Field(description="record keys tombstoned")
    requests_found: int = Field(description="requests whose subject still has records there")
    records_left: int = Field(description="their records")
    accepted: str | None = Field(description="the data map's accepted reason for records left (accept_retention)")
    seconds: float


class RunReportDocument(_Document):
    """The run report: what one `dsr run` did, table by table and request by request."""

    version: int = VERSION
    run_id: str
    started_at: str
    seconds: dict[str, float] = Field(description="seconds per stage")
    cost: dict[str, IoRecord] = Field(description="Spark's I/O per stage")
    tables: dict[str, TableRecord]
    ledger_purge: dict[str, Any] = Field(description="the ledger's own history purge and its proof")
    export: ExportSummary | dict[str, Any]
    requests: list[RequestLine]
    not_processed: dict[str, int] = Field(description="request types recorded but not processed -> how many")
    purge_schedule: PurgeSchedule | dict[str, Any]
    collateral_failures: dict[str, str | None]
    held: dict[str, str] = Field(description="tables on a collateral hold (`dsr release` lifts it) -> why")
    legal_holds: dict[str, str] = Field(default_factory=dict, description="tables under a legal hold (`dsr hold`), "
                                        "neither erased nor purged -> the hold")
    resurrections: dict[str, ResurrectionRecord] = Field(
        default_factory=dict, description="tables where people erased earlier came back -> what was found")
    shares: dict[str, ShareRecord]
    records: RecordExpiry | None = Field(None, description="our own records past their period, removed by this "
                                         "run: completed requests, access packages, unverified intake requests")
    drop: DropMatch | dict[str, Any] = Field(default_factory=dict, description="California DROP work items "
                                              "matched at the start of the run (none waiting: empty)")
    retention: RetentionPass | None = Field(None, description="the data map's retention rules (`expire:`) enforced "
                                            "by this run: per table and rule the rows past it, the commit, the "
                                            "purge and the proof; tables a legal hold kept out")
    topics: dict[str, TopicRecord] = Field(default_factory=dict, description="the data map's Kafka topics, settled "
                                           "for the erase batch and read back")
    clean_after_seconds: dict[str, float] = Field(
        default_factory=dict, description="derived tables: seconds from the run's start until each was clean of the "
        "batch's people (a pipeline's table: when the run found its pipeline had carried the deletes; others: the "
        "engine's erase or recomputation commit)")
    summary: Summary
    per_table: dict[str, TableFigures]


def json_schemas() -> dict[str, dict]:
    """The published JSON Schemas of the evidence documents, by file stem."""
    return {"run-report": RunReportDocument.model_json_schema(),
            "erasure-evidence": ErasureEvidence.model_json_schema(),
            "access-evidence": AccessEvidence.model_json_schema()}
