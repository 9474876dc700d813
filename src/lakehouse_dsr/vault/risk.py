"""Re-identification risk of a table's quasi-identifiers: k-anonymity and l-diversity, counts only.

An equivalence class is the set of rows sharing one combination of quasi-identifier values (ZIP
code, birth date, gender ...). A row in a class smaller than k can be singled out by someone who
knows those values of a person; a class whose sensitive column holds a single value gives that
value away to anyone who knows the person is in it (l-diversity 1). Nothing here returns a value
of any column: only class sizes and counts leave Spark.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import cast

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from ..config import Settings
from ..datamap import DataMap, column_ref
from ..exceptions import DataMapError, DsrError
from ..inventory.check import field_at
from ..lake.lakehouse import Lake

# more quasi-identifiers: single columns and pairs only (each subset: one more roll-up of the classes)
ALL_SUBSETS_UP_TO = 4


@dataclass
class Combination:
    """One subset of the quasi-identifiers, as risky as its smallest class and its rows below k."""

    columns: list[str]
    smallest_class: int
    rows_below_k: int
    share_rows_below_k: float


@dataclass
class RiskReport:
    table: str
    quasi_identifiers: list[str]
    k: int
    rows: int
    classes: int
    smallest_class: int
    rows_below_k: int
    share_rows_below_k: float
    subject_column: str | None = None
    subjects: int | None = None
    subjects_below_k: int | None = None
    share_subjects_below_k: float | None = None
    sensitive: str | None = None
    l_diversity: int | None = None  # the fewest distinct sensitive values in any class
    share_rows_single_value: float | None = None  # rows in classes whose sensitive column holds one value
    class_sizes: dict[int, int] = field(default_factory=dict)  # class size -> classes of that size
    riskiest: list[Combination] = field(default_factory=list)

    @property
    def k_anonymous(self) -> bool:
        return self.smallest_class >= self.k

    def as_dict(self) -> dict:
        return {**asdict(self), "k_anonymous": self.k_anonymous,
                "class_sizes": {str(size): n for size, n in self.class_sizes.items()}}


def _checked(df: DataFrame, table: str, quasi: list[str], sensitive: str | None, subject: str | None,
             k: int) -> None:
    if k < 2:
        raise DsrError(f"k must be at least 2 (got {k})")
    if not quasi:
        raise DsrError("name at least one quasi-identifier column")
    if len(set(quasi)) != len(quasi):
        raise DsrError("a quasi-identifier column is named twice")
    problems = []
    for column in [*quasi, *([sensitive] if sensitive else []), *([subject] if subject else [])]:
        try:
            field_at(df.schema, column)
        except ValueError as exc:
            problems.append(f"table {table} {exc}")
    if sensitive in quasi:
        problems.append(f"the sensitive column {sensitive} is also a quasi-identifier")
    if problems:
        raise DataMapError("; ".join(problems))


def _subject_column(datamap: DataMap, table: str, subject: str | None) -> str | None:
    """`subject`, else the table's first flat key column in the data map, else None (no subject counts)."""
    if subject:
        return subject
    mapping = datamap.keyed.get(table)
    flat = [c for c in (mapping.key_columns if mapping else []) if not c.endswith("[]")]
    return flat[0] if flat else None


def assess(spark: SparkSession, settings: Settings, table: str, quasi: list[str], k: int = 5,
           sensitive: str | None = None, subject: str | None = None) -> RiskReport:
    """k-anonymity (and l-diversity for `sensitive`) of `table` over the `quasi` columns (assess_table
    in the lake and data map of `settings`)."""
    return assess_table(Lake.of(spark, settings), settings.datamap, table, quasi, k, sensitive, subject)


def assess_table(lake: Lake, datamap: DataMap, table: str, quasi: list[str], k: int = 5,
                 sensitive: str | None = None, subject: str | None = None) -> RiskReport:
    """k-anonymity (and l-diversity for `sensitive`) of `table` over the `quasi` columns (`subject`:
    the column counting people, default the table's first flat key column in `datamap`).

    Cost: one aggregation of the table by the quasi-identifiers (classes kept in Spark, only their
    size distribution reaches the driver); with a subject column, one more scan joined with the
    classes for the subject counts; `riskiest` rolls the classes up per subset of the
    quasi-identifiers (all subsets up to four columns; beyond, single columns and pairs).
    """
    df = lake.spark.table(lake.quoted(table))
    subject = _subject_column(datamap, table, subject)
    _checked(df, table, quasi, sensitive, subject, k)
    named = df.select(*[F.col(column_ref(c)).alias(f"dsr_q{i}") for i, c in enumerate(quasi)],
                      *([F.col(column_ref(sensitive)).alias("dsr_s")] if sensitive else []),
                      *([F.col(column_ref(subject)).alias("dsr_subject")] if subject else []))
    keys = [f"dsr_q{i}" for i in range(len(quasi))]
    classes = named.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("n"),
        *([F.countDistinct("dsr_s").alias("l")] if sensitive else [])).localCheckpoint(eager=True)
    summary = _one(classes.agg(
        F.count(F.lit(1)).alias("classes"), F.sum("n").alias("rows"), F.min("n").alias("smallest"),
        F.sum(F.when(F.col("n") < k, F.col("n")).otherwise(0)).alias("below"),
        *([F.min("l").alias("l"), F.sum(F.when(F.col("l") <= 1, F.col("n")).otherwise(0)).alias("single")]
          if sensitive else [])))
    rows = int(summary["rows"] or 0)
    report = RiskReport(table, quasi, k, rows, int(summary["classes"]), int(summary["smallest"] or 0),
                        int(summary["below"] or 0), _share(summary["below"], rows))
    report.class_sizes = {int(r.n): int(r["count"]) for r in classes.groupBy("n").count().orderBy("n").collect()}
    if sensitive:
        report.sensitive, report.l_diversity = sensitive, int(summary["l"] or 0)
        report.share_rows_single_value = _share(summary["single"], rows)
    if subject:  # one pass: every row with its class's size
        sized = classes.select(*[F.col(c).alias(f"{c}_c") for c in keys], "n")
        on = [named[c].eqNullSafe(sized[f"{c}_c"]) for c in keys]
        counts = _one(named.join(F.broadcast(sized) if report.classes < 1_000_000 else sized, on).agg(
            F.countDistinct("dsr_subject").alias("all"),
            F.countDistinct(F.when(F.col("n") < k, F.col("dsr_subject"))).alias("below")))
        report.subject_column, report.subjects, report.subjects_below_k = subject, int(counts.all), int(counts.below)
        report.share_subjects_below_k = _share(report.subjects_below_k, report.subjects)
    report.riskiest = _riskiest(classes, quasi, keys, k, rows)
    return report


def _one(aggregate: DataFrame) -> Row:
    """The row of an aggregate without groups (there is always one)."""
    return cast(Row, aggregate.first())


def _share(part, whole: int) -> float:
    return round(int(part or 0) / whole, 6) if whole else 0.0


def _riskiest(classes: DataFrame, quasi: list[str], keys: list[str], k: int, rows: int, top: int = 5
              ) -> list[Combination]:
    """The subsets of the quasi-identifiers that leave the most rows in classes below k (then the
    smallest class): which columns to generalise or drop first. Rolled up from `classes` (kept),
    so the table is not read again."""
    sizes = range(1, len(keys) + 1) if len(keys) <= ALL_SUBSETS_UP_TO else (1, 2)
    found = []
    for size in sizes:
        for subset in combinations(range(len(keys)), size):
            if size == len(keys):
                continue  # the whole set is the report itself
            counts = classes.groupBy(*[keys[i] for i in subset]).agg(F.sum("n").alias("count"))
            r = _one(counts.agg(F.min("count").alias("smallest"),
                                F.sum(F.when(F.col("count") < k, F.col("count")).otherwise(0)).alias("below")))
            found.append(Combination([quasi[i] for i in subset], int(r.smallest or 0), int(r.below or 0),
                                     _share(r.below, rows)))
    return sorted(found, key=lambda c: (-c.rows_below_k, c.smallest_class, c.columns))[:top]


def plot(report: RiskReport, path: Path) -> None:
    """Class sizes as a bar chart (rows per class size), the k threshold marked."""
    try:
        import matplotlib
    except ImportError:
        raise DsrError("--plot needs matplotlib: pip install matplotlib") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(report.class_sizes)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([str(s) for s in sizes], [s * report.class_sizes[s] for s in sizes],
           color=["tab:red" if s < report.k else "tab:blue" for s in sizes])
    ax.set_xlabel("class size (rows sharing one combination of quasi-identifiers)")
    ax.set_ylabel("rows")
    ax.set_title(f"{report.table}: {report.share_rows_below_k:.1%} of rows in classes below k={report.k} "
                 f"(red); smallest class {report.smallest_class}")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
