"""`dsr`: a thin command-line shell over the library (every command is one library call).

The control-plane commands (submit, status, extend, release, and a run with nothing to do) never
import PySpark or start a JVM: Spark-side modules are imported inside the commands that need them.
"""

from __future__ import annotations

import atexit
import functools
import gc
import getpass
import json
import random
import shutil
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, cast

import typer
from rich.console import Console
from rich.filesize import decimal
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBars
from rich.table import Table

from .config import EXPORT_FORMATS, Settings, load_settings
from .exceptions import DsrError, LedgerBusyError, disk_full, first_line
from .keys import rotate_key
from .ledger.holds import add_hold, list_holds, parse_until, release_hold
from .ledger.ledger import Ledger
from .ledger.requests import (
    REGULATIONS,
    REQUEST_TYPES,
    RequestBatch,
    RequestInput,
    parse_received,
    read_requests_csv,
    utc_now,
)

if TYPE_CHECKING:  # imported by the commands that start Spark, not by the control plane's
    from .runner.plan import PlanReport

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Data subject requests (GDPR/CCPA) on a lakehouse of Apache Iceberg and Delta Lake tables.")
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)
_state: dict = {}  # per invocation: the --config path and the settings loaded from it
TableFormat = Literal["iceberg", "delta"]

ConfigOption = Annotated[Path | None, typer.Option("--config", "-c", help="dsr.yaml to use (default: ./dsr.yaml)")]


class Bars:
    """Rich progress bars fed by the library's Progress protocol."""

    def __init__(self) -> None:
        self._bars = RichBars(SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<20}"), BarColumn(),
                              MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                              console=console, transient=False)
        self._task = cast(TaskID, None)  # stage() comes first
        self._pending = False

    def __enter__(self) -> Bars:
        self._bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bars.stop()

    def stage(self, name: str, total: int) -> None:
        self._task = self._bars.add_task("", total=max(total, 1), stage=name)
        self._pending = False

    def step(self, description: str) -> None:
        if self._pending:
            self._bars.advance(self._task)
        self._bars.update(self._task, description=description)
        self._pending = True

    def done(self) -> None:
        self._bars.update(self._task, completed=self._bars.tasks[-1].total, description="done")


@app.callback()
def main(ctx: typer.Context, config: ConfigOption = None) -> None:
    _state.clear()
    _state["config"] = config
    _state["command"] = ctx.invoked_subcommand


# Commands that need no data map (the ledger, the intake service, tokens, jars): every other one refuses a
# config without a `datamap:` section (exit 2) as it loads it, before anything changes.
WITHOUT_DATAMAP = {"submit", "status", "extend", "certificate", "release", "expire-records", "metrics", "hold",
                   "rotate-key", "jars", "serve", "operator", "webhooks"}


def _name_value(text: str, flag: str) -> tuple[str, str]:
    """NAME=VALUE of a repeatable flag; a usage error (exit 2) otherwise."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise typer.BadParameter(f"{text!r}: write NAME=VALUE", param_hint=flag)
    return name.strip(), value


def _settings() -> Settings:
    if "settings" not in _state:
        settings = load_settings(_state.get("config"))
        if _state.get("command") not in WITHOUT_DATAMAP:
            settings.datamap  # noqa: B018  (the ConfigError naming the missing section)
        _state["settings"] = settings
    return _state["settings"]


def _spark(by_lake_size: bool = False):
    """One session per invocation (demo runs several commands), started on first need.
    `by_lake_size`: a command whose work follows the mapped tables' size (run, verify) gets the
    quick JIT and interpreted queries on a small lake (lake/jvm.py, lake/spark.py), and, when this
    process started the JVM, keeps the JVM objects Python drops (lake/spark.py's `keep_java_objects`:
    the command ends with its one run); generating or benchmarking data never does."""
    if "spark" not in _state:
        from pyspark import SparkContext

        from .lake import jvm
        from .lake.spark import build_session, keep_java_objects

        settings = _settings()
        small = by_lake_size and jvm.small_lake(settings)
        ours = SparkContext._active_spark_context is None  # not a session someone else's code goes on using
        _state["spark"] = build_session(settings, quick_jit=small, interpreted=small)
        _state["own_jvm"] = ours
        if small and ours:
            keep_java_objects(_state["spark"])
    return _state["spark"]


def _leave() -> None:
    """The process is done with Spark: a JVM it started exits now (lake/spark.py's `close_gateway`);
    once per process."""
    if _state.pop("own_jvm", False):
        from .lake.spark import close_gateway

        close_gateway(_state["spark"])


def _done_with_spark(session: object) -> None:
    """`dsr run`'s Spark work is over: a JVM this process started exits while the run records its
    outcomes in the ledger (`demo` goes on with more commands on the same session). Ending it early
    only saves time: if that fails, the run still records its outcomes."""
    if _state.get("command") == "run":
        try:
            _leave()
        except Exception as exc:  # py4j's, say: the JVM then ends with the process
            err.print(f"[yellow]note:[/] Spark did not stop early: {escape(first_line(exc))}", soft_wrap=True)


def _ledger() -> Ledger:
    """The ledger through pyiceberg (no JVM); a catalog that cannot be reached is a one-line error."""
    return Ledger(_settings())


@app.command()
def generate(
    users: Annotated[int, typer.Option(min=1, help="number of users")] = 10_000,
    events: Annotated[int, typer.Option(min=0, help="number of events (the notebook: 10,000,000)")] = 1_000_000,
    seed: Annotated[int, typer.Option(help="random seed; same seed, same data")] = 42,
    batches: Annotated[int | None, typer.Option(min=1, help="event append batches (default: one per 1M)")] = None,
    table_format: Annotated[TableFormat, typer.Option("--format", help="iceberg | delta (under delta.warehouse)")
                            ] = "iceberg",
) -> None:
    """(Re)create the demo tables: users, events, newsletter (by email), orders (redacted)."""
    from . import synth

    settings = _demo_settings(table_format)
    spark = _spark()
    with Bars() as bars:
        result = synth.generate(spark, settings, users, events, seed, batches, bars, table_format=table_format)
    console.print(f"generated {result.users:,} users, {result.events:,} events in {result.batches} batch(es), "
                  f"{result.orders:,} orders and the newsletter list")


@app.command()
def submit(
    subject: Annotated[str | None, typer.Option(help="subject id (the data map's subject identifier)")] = None,
    type_: Annotated[str | None, typer.Option("--type", help="erase | access | opt_out | opt_in")] = None,
    regulation: Annotated[str, typer.Option(help="gdpr | ccpa")] = "gdpr",
    received: Annotated[str | None, typer.Option(help="when it was received (ISO-8601; default now)")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="CSV: subject_id,type[,regulation][,received_at]")] = None,
) -> None:
    """Record requests in the ledger (an open duplicate is not added twice)."""
    if file is not None:
        if subject is not None or type_ is not None:
            raise DsrError("give either --file or --subject/--type, not both")
        inputs = read_requests_csv(file)
    else:
        if subject is None or type_ is None:
            raise DsrError(f"--subject and --type are required (types: {', '.join(REQUEST_TYPES)}; "
                           f"regulations: {', '.join(REGULATIONS)})")
        when = parse_received(received, "--received") if received else None
        inputs = RequestBatch.of([RequestInput(subject, type_.lower(), regulation.lower(), when)])
    result = _ledger().submit(inputs)
    # One write for every id: a million lines through Rich's renderer took minutes.
    console.file.write("".join(f"submitted {request_id}\n" for request_id in result.created))
    console.print(f"{len(result.created)} request(s) submitted, "
                  f"{result.duplicates} duplicate(s) of open requests ignored")


@app.command("run")
def run_cmd(
    report: Annotated[Path | None, typer.Option(help="write the JSON run report here")] = None,
    html: Annotated[Path | None, typer.Option(help="write the run report as a page with charts here")] = None,
    export_format: Annotated[str | None, typer.Option("--format", help="access packages: json | csv | parquet")] = None,
    export_dir: Annotated[Path | None, typer.Option(help="where access packages go (default ./exports)")] = None,
) -> None:
    """Fulfil every open access request (one package each), then erase, purge and verify every erase request."""
    from .runner import run as run_batch

    settings = _settings()
    if export_format is not None:
        if export_format not in EXPORT_FORMATS:
            raise DsrError(f"unknown export format {export_format!r} (expected one of {', '.join(EXPORT_FORMATS)})")
        settings = settings.replace(export={"format": export_format})
    if export_dir is not None:
        settings = settings.replace(export={"directory": export_dir.resolve()})
    with Bars() as bars:
        # Spark starts only if there is work
        result = run_batch(lambda: _spark(by_lake_size=True), settings, bars, release=_done_with_spark)
    if report:
        result.write(report)
    if html:
        result.write_html(html)
    if not result.requests:
        console.print("no open access or erase requests")
    result.render(console)
    if result.needs_attention:
        raise typer.Exit(1)


@app.command("plan")
def plan_cmd(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """What the next `dsr run` would do for the open erase requests, per table: candidate files and bytes,
    rows matched, strategy, estimated seconds; and every data-map problem that would stop it (exit 2).
    Changes nothing."""
    from .runner.plan import plan

    result = plan(lambda: _spark(by_lake_size=True), _settings())
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        _render_plan(result)
    if result.problems:
        raise typer.Exit(2)


def _render_plan(result: PlanReport) -> None:
    """`dsr plan`'s report for people (runner/plan.py's PlanReport)."""
    r = result.requests
    table = Table(title=f"plan for {r.erase} open erase request(s)" + (", purged in the same run" if result.purge
                                                                       else ""))
    for column in ("table", "action", "strategy", "files (cand./all)", "bytes (cand./all)", "rows", "files matched",
                   "rewritten", "est. s"):
        table.add_column(column, overflow="fold")
    for name, t in result.tables.items():
        table.add_row(name, t.action, t.strategy, f"{t.files:,}/{t.total_files:,}",
                      f"{decimal(t.bytes)}/{decimal(t.total_bytes)}",
                      "counted by the rewrite" if t.rows is None else f"{t.rows:,}",
                      "every candidate" if t.matched_files is None else f"{t.matched_files:,}",
                      decimal(t.rewrite_bytes), f"{t.estimated_seconds:,.1f}")
    console.print(table if result.tables else "no table to plan" + ("" if r.erase else ": no open erase requests"))
    for name, why in result.not_planned.items():
        console.print(f"not planned: {name}: {escape(why)}")
    others = {"access": r.access, "opt-out/opt-in": r.consent, "held by a legal hold": r.held,
              "waiting for the batched purge": r.waiting_for_purge}
    if any(others.values()):
        console.print("other open requests (not planned): " + ", ".join(f"{n} {k}" for k, n in others.items() if n))
    rates = result.rates
    measured = (f"the defaults scaled by {rates.scale:,.2f}, measured over {rates.fixed_seconds.runs} recorded run(s)"
                if rates.fixed_seconds.source == "measured" else "the defaults: no recorded run")
    console.print(f"estimated: {result.estimated_seconds:,.1f} s ({rates.fixed_seconds.value:,.1f} s, "
                  f"{rates.seconds_per_request.value * 1000:,.3f} ms per request, "
                  f"{rates.rewrite_bytes_per_second.value / 1e6:,.1f} MB rewritten per s: {measured}); "
                  f"this plan took {result.seconds:,.1f} s")
    for p in result.problems:
        console.print(f"[red]problem:[/] {escape(p.text)}", soft_wrap=True)


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """List requests with their status and days left (no subject identifiers are shown)."""
    rows = _ledger().statuses()
    if as_json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return
    table = Table(title="requests")
    for column in ("request", "type", "reg.", "status", "received", "due", "days left", "purge by", "note"):
        table.add_column(column)
    for r in rows:
        late = r.days_left is not None and r.days_left < 0
        table.add_row(r.request_id, r.request_type, r.regulation, r.status, r.received[:10],
                      r.due_date + (" (ext.)" if r.extended else ""),
                      "" if r.days_left is None else f"[red]{r.days_left}[/]" if late else str(r.days_left),
                      r.purge_by or "", (r.status_reason or "")[:80])
    console.print(table)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    console.print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "the ledger is empty")
    purge_dates = sorted(r.purge_by for r in rows if r.purge_by)  # set only while a request waits (erased)
    if purge_dates:
        console.print(f"waiting for the physical purge: {len(purge_dates)} request(s), the first due by "
                      f"{purge_dates[0]} (logically erased; completed once purged and verified)")


@app.command()
def extend(request_id: str, reason: Annotated[str, typer.Option(help="why (told to the data subject)")]) -> None:
    """Apply the regulation's one allowed deadline extension (GDPR +2 months, CCPA +45 days)."""
    r = _ledger().extend(request_id, reason)
    console.print(f"{r.request_id}: due {r.due_date} ({r.days_left} days left)")


@app.command()
def certificate(
    request_id: Annotated[str | None, typer.Argument(help="a completed request")] = None,
    html: Annotated[Path | None, typer.Option(help="write the certificate as a readable page here")] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="write the signed JSON certificate here")] = None,
    check: Annotated[Path | None, typer.Option(help="check a signed JSON certificate: exit 0 intact, 1 not")] = None,
) -> None:
    """A signed certificate of a completed request (no subject identifier), or --check one for alteration."""
    from .evidence.certificate import build_certificate, certificate_html, check_certificate, read_certificate
    from .evidence.report import write_owner_only

    if check is not None:
        if request_id or html or json_file:
            raise DsrError("--check FILE takes no request id, --html or --json")
        result = check_certificate(read_certificate(check), _ledger())
        console.print(f"{escape(str(check))}: [{'green' if result.intact else 'red'}]{escape(result.reason)}[/]",
                      soft_wrap=True)
        if not result.intact:
            raise typer.Exit(1)
        return
    if request_id is None:
        raise DsrError("give a completed request's id, or --check FILE")
    doc = build_certificate(_ledger(), request_id)
    if json_file:
        write_owner_only(json_file, json.dumps(doc, indent=2, sort_keys=True))
    if html:
        write_owner_only(html, certificate_html(doc))
    r = doc["request"]
    met = "[green]met[/]" if r["deadline_met"] else "[red]missed[/]"
    console.print(f"{r['request_id']}: {r['type']} ({r['regulation']}), received {r['received'][:10]}, due {r['due']}"
                  f"{' (extended)' if r['extended'] else ''}, completed {r['completed'][:10]}: deadline {met}")
    console.print(f"{doc['totals']['rows']:,} row(s) in {doc['totals']['tables']} table(s); signed with key "
                  f"{doc['signature']['key_id']}")
    for path in (json_file, html):
        if path:
            console.print(f"written: {escape(str(path))}")
    if not (json_file or html):
        console.print("save it with --json FILE (the signed original) and --html FILE (a page to read)")


@app.command("verify")
def verify_cmd(request_id: Annotated[list[str] | None, typer.Argument(help="default: all completed")] = None) -> None:
    """Re-run the erasure proof for completed requests (from their keyed hashes)."""
    from .stages.verify import verify_completed

    results = verify_completed(_spark(by_lake_size=True), _settings(), request_id or None)
    bad = {rid: reasons for rid, reasons in results.items() if reasons}
    for rid, reasons in bad.items():
        console.print(f"[red]{rid}: FAILED[/] {'; '.join(reasons)}")
    console.print(f"{len(results) - len(bad)} of {len(results)} completed request(s) verified erased")
    if bad:
        raise typer.Exit(1)


@app.command("warm-up")
def warm_up() -> None:
    """Record the classes a run loads into a class-data-sharing archive: later commands start Spark faster."""
    from .warmup import record_archive

    with console.status("recording the classes of a tiny run (about half a minute)"):
        result = record_archive()
    console.print(f"class archive {result.archive} ({result.bytes / 2**20:.0f} MB): "
                  "commands that start Spark now map these classes instead of loading them")
    if result.removed:
        console.print(f"removed {len(result.removed)} archive(s) of Java or Spark installations no longer here "
                      f"({sum(size for _, size in result.removed) / 2**20:.0f} MB)")


@app.command("rotate-key")
def rotate_key_cmd() -> None:
    """Replace the HMAC key; the old one is retired to the keyring file, so completed requests stay verifiable."""
    r = rotate_key(_settings().key_file())
    console.print(f"key {r.new_id} is now active; key {r.old_id} retired to {escape(str(r.retired_file))} "
                  f"({r.retired} retired key(s), keep the file as safe as the key)")


@app.command("fetch-jars")
def fetch_jars(
    s3a: Annotated[bool, typer.Option("--s3a", help="also Hadoop's S3A connector (hadoop-aws, its AWS SDK)")] = False,
    line: Annotated[str | None, typer.Option(help="Spark line, 3.5 or 4.1 (default: the installed PySpark's)")] = None,
    kafka_broker: Annotated[bool, typer.Option(
        "--kafka-broker", help="instead, a local Apache Kafka broker's jars with their dependencies (tests, "
                               "benchmarks: lakehouse_dsr.lake.broker)")] = False,
) -> None:
    """Fetch the Spark-side jars (Iceberg, Delta, Kafka's connector; S3A with --s3a) from Maven Central
    through mvn, once; print their cache folder (~/.cache/lakehouse-dsr/jars/spark-LINE/...) for
    spark.jars. With --kafka-broker, a local Kafka broker's jars instead (~/.cache/lakehouse-dsr/jars/kafka-broker)."""
    from .lake import jars as format_jars

    if kafka_broker and (s3a or line):
        raise typer.BadParameter("--kafka-broker fetches the broker's jars alone: fetch Spark's (--s3a, --line) "
                                 "in a command of their own")
    with err.status("fetching the jars from Maven Central through mvn (once; then from the cache)"):
        found = format_jars.broker() if kafka_broker else format_jars.resolve(line, s3a=s3a)
    print(found[0].parent)  # plain stdout: scripts do DSR_JARS=$(dsr fetch-jars --s3a)


@app.command()
def jars() -> None:
    """Print the jars this config puts on the session, comma-separated: `spark-submit --jars $(dsr jars)`."""
    from .lake.spark import session_jars

    print(",".join(session_jars(_settings())))


@app.command()
def schema(out: Annotated[Path, typer.Option(help="folder to write them into")] = Path("schemas")) -> None:
    """Write the JSON Schemas of dsr.yaml, the run report, request evidence and the certificate."""
    from .evidence.schemas import write_schemas

    for path in write_schemas(out):
        console.print(str(path))


@app.command()
def release(table: str, reason: Annotated[str, typer.Option(help="what was checked or rolled back")]) -> None:
    """Lift the hold a collateral-check failure put on a table, so runs erase and purge there again
    (legal holds are `dsr hold`)."""
    step = _ledger().journal.release(table, reason)
    console.print(f"{table} released (held since run {step.detail['hold_run_id']})")


@app.command("expire-records")
def expire_records_cmd(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would go; remove nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Remove our own records past their period (`records:` in dsr.yaml): completed request records,
    access packages, unverified intake requests. `dsr run` does this too."""
    from .ledger.records import expire_records

    result = expire_records(_settings(), dry_run=dry_run)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        console.print(result.summary())
    if result.ids_found:
        raise typer.Exit(1)


@app.command()
def expire(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count what is past each rule; change nothing")] = False,
    table: Annotated[list[str] | None, typer.Option(help="only this table (repeatable; default: all with rules)")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Enforce the data map's retention rules (`expire:`): delete or redact what is past each rule,
    purge and prove it. `dsr run` does this too. Exit 1 when the proof fails."""
    from .runner.retention import expire as expire_rules

    result = expire_rules(_spark(), _settings(), dry_run=dry_run, tables=table)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        for name, t in result.tables.items():
            for r in t.rules:
                done = ("would change" if result.dry_run else "kept" if t.blocked else "changed") + \
                    f" {r.rows_past} row(s)"
                how = " (whole files dropped, none rewritten)" if r.metadata_only else ""
                console.print(f"{name}: {escape(r.rule)} (before {r.cutoff}): {done}{how}")
            for ref, e in t.refs.items():
                if e.rows_past:
                    console.print(f"{name}: {escape(ref)} pinned {e.rows_past} row(s) past a rule: {e.outcome}")
            if t.blocked:
                console.print(f"{name} {escape(t.blocked)}")
            if not result.dry_run:
                console.print(f"{name}: " + ("[green]proven[/]" if t.passed else "[red]rows past a rule remain[/]")
                              + (f": live 0, history {t.history}, storage {t.storage}" if t.purge else ""))
        for name, why in result.skipped.items():
            console.print(f"{name} skipped: {escape(why)}")
        if result.subject_holds:
            console.print(f"{result.subject_holds} subject hold(s) active: retention does not apply them row by row")
    if not result.passed:
        raise typer.Exit(1)


@app.command("retention")
def retention_cmd(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """Conformance of the retention rules: per table and rule the oldest row, the rows and bytes
    (estimated) past it, the oldest retained snapshot still holding rows past it, when more rows
    pass it and what clears them. Changes nothing."""
    from .runner.retention import status

    result = status(_spark(), _settings())
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    table = Table(title=f"retention on {result.today}")
    for column in ("table", "rule", "past before", "oldest row", "rows past", "bytes past (est.)",
                   "oldest snapshot holding them", "next rows pass on", "cleared by"):
        table.add_column(column)
    for name, t in result.tables.items():
        for r in t.rules:
            held = r.oldest_snapshot_holding
            snapshot = "none" if held is None else f"{held.snapshot_id} ({held.committed_at[:19]}Z" + \
                (f", {', '.join(held.refs)})" if held.refs else ")")
            table.add_row(name, escape(r.rule), r.cutoff, r.oldest or "", str(r.rows_past),
                          str(r.bytes_past_estimate), escape(snapshot), r.next_crossing or "", escape(r.cleared_by))
    console.print(table if result.tables else "no table has retention rules (expire: in the data map)")
    for name, why in result.kept_longer.items():
        console.print(f"[yellow]{name}[/] {escape(why)}")


@app.command()
def metrics(
    year: Annotated[str, typer.Option(help="the calendar year requests were received, e.g. 2025")],
    regulation: Annotated[str | None, typer.Option(help="only gdpr or ccpa requests (default: all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """A year's request figures as CCPA § 7102 asks large businesses to publish them, per request type
    (expired records included)."""
    from .ledger.records import metrics as year_metrics
    from .ledger.records import parse_year

    if regulation is not None and regulation.lower() not in REGULATIONS:
        raise DsrError(f"--regulation: unknown regulation {regulation!r} (expected one of {', '.join(REGULATIONS)})")
    result = year_metrics(_settings(), parse_year(year), regulation.lower() if regulation else None)
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    table = Table(title=f"requests received in {result.year}" + (f" ({result.regulation})" if result.regulation
                                                                    else ""))
    for column in ("type", "received", "complied (whole or part)", "denied", "pending", "median days", "mean days"):
        table.add_column(column)
    for t in result.types:
        table.add_row(f"{t.label} ({t.request_type})", str(t.received), str(t.complied), str(t.denied), str(t.pending),
                      "" if t.median_days is None else f"{t.median_days:g}",
                      "" if t.mean_days is None else f"{t.mean_days:g}")
    console.print(table if result.types else f"no requests received in {result.year}")
    if result.expired_included:
        console.print(f"{result.expired_included} of them from the figures kept for expired records")


hold_app = typer.Typer(no_args_is_help=True, help="Legal holds: subjects or tables no run may erase while held.")
app.add_typer(hold_app, name="hold")
ByOption = Annotated[str | None, typer.Option("--by", help="who acts (default: the OS user)")]


def _by(name: str | None) -> str:
    return name if name is not None else getpass.getuser()


@hold_app.command("add")
def hold_add(
    reason: Annotated[str, typer.Option(help="why (a legal obligation or claim; told to the data subject)")],
    subject: Annotated[str | None, typer.Option(help="hold this subject's erase requests")] = None,
    table: Annotated[str | None, typer.Option(help="hold this mapped table: erased and purged for nobody")] = None,
    until: Annotated[str | None, typer.Option(help="last day the hold applies, YYYY-MM-DD (default: until "
                                                   "released)")] = None,
    by: ByOption = None,
) -> None:
    """Place a legal hold on a subject or a table (the subject is stored as a keyed hash only)."""
    h = add_hold(_ledger(), reason, _by(by), subject=subject, table=table,
                 until=parse_until(until) if until is not None else None)
    console.print(f"{h.hold_id}: {h.target} held{f' until {h.until}' if h.until else ''}")


@hold_app.command("list")
def hold_list(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """Every legal hold, active or not (subjects appear as keyed hashes, never in plaintext)."""
    holds, today = list_holds(_ledger()), utc_now().date()
    if as_json:
        print(json.dumps([{**h.model_dump(mode="json"), "active": h.active(today)} for h in holds], indent=2))
        return
    table = Table(title="legal holds")
    for column in ("hold", "on", "reason", "until", "placed", "by", "released", "active"):
        table.add_column(column)
    for h in holds:
        table.add_row(h.hold_id, escape(h.target), escape(h.reason), str(h.until or ""),
                      f"{h.created_at:%Y-%m-%d %H:%M}", escape(h.created_by),
                      f"{h.released_at:%Y-%m-%d %H:%M} by {escape(h.released_by or '')}" if h.released_at else "",
                      "yes" if h.active(today) else "no")
    console.print(table if holds else "no legal holds")


@hold_app.command("release")
def hold_release(hold_id: str, by: ByOption = None) -> None:
    """Release a legal hold: the next `dsr run` erases what it held."""
    h = release_hold(_ledger(), hold_id, _by(by))
    console.print(f"{h.hold_id} released ({h.target}); the next dsr run resumes its requests")


@app.command()
def optimize(
    table: Annotated[list[str] | None, typer.Option(help="table to cluster (default: every mapped table)")] = None,
    target_file_size_mb: Annotated[int, typer.Option(min=1, help="target data file size")] = 128,
) -> None:
    """Cluster tables by their subject key: write order, bloom filter, sorted rewrite."""
    from .lake import layout
    from .lake.lakehouse import Lake

    settings = _settings()
    tables = table or list(settings.datamap.tables)
    lake = Lake.of(_spark(), settings)
    results = []
    with Bars() as bars:
        bars.stage("optimize", len(tables))
        for name in tables:
            bars.step(name)
            results.append(layout.optimize(lake.table(name), settings.datamap,
                                           target_file_size_bytes=target_file_size_mb << 20))
        bars.done()
    summary = Table(title="clustered by subject key")
    for column in ("table", "key", "files before", "files after", "MB rewritten", "seconds"):
        summary.add_column(column)
    for r in results:
        summary.add_row(r.table, r.key, str(r.files_before), str(r.files_after), f"{r.bytes_rewritten / 1e6:.1f}",
                        f"{r.seconds:.1f}")
    console.print(summary)


@app.command()
def adopt(
    path: Annotated[str, typer.Argument(help="folder of the plain dataset (local, s3a:, hdfs: ...)")],
    table: Annotated[str, typer.Option(help="the new table's name, namespace.table")],
    fmt: Annotated[str, typer.Option("--format", help="parquet (registered in place in Iceberg) | delta (Parquet "
                                     "converted in place to Delta) | json | csv (copied into Iceberg)")] = "parquet",
) -> None:
    """Bring a plain Parquet/JSON/CSV dataset under Iceberg (or Parquet under Delta, in place), so it gets the
    full erase-purge-verify cycle."""
    from .lake.lakehouse import Lake
    from .lake.plainfiles import adopt as adopt_dataset

    done = adopt_dataset(Lake.of(_spark(), _settings()), path, table, fmt)
    how = "copied into the table (the original files are untouched: remove them once you no longer need them)" \
        if done.copied else "registered in place (the table now owns those files; a purge deletes rewritten ones)"
    console.print(f"{done.table}: {done.rows} rows from {done.files} {done.format} file(s), {how}")
    located = f", format: delta, path: {path}" if done.format == "delta" else ""
    console.print(f"map it: {done.table}: {{key: <subject column>{located}}}")


@app.command()
def ingest(
    source: Annotated[str, typer.Option(help="folder the files arrive in (local, s3a:, hdfs: ...), or a Kafka "
                                             "topic: kafka://HOST:PORT/TOPIC")],
    table: Annotated[str, typer.Option(help="table to append to, namespace.table (Iceberg or Delta, as the data map "
                                            "places it; must exist)")],
    checkpoint: Annotated[str, typer.Option(help="the query's checkpoint folder: a restart resumes from it")],
    fmt: Annotated[str, typer.Option("--format", help="json | csv | parquet (files); json (a Kafka record's value)")
                   ] = "json",
    once: Annotated[bool, typer.Option("--once", help="ingest what is there now, then stop (availableNow)")] = False,
    key: Annotated[str | None, typer.Option(help="column holding the identifier (default: the table's data-map key)")
                   ] = None,
    identifier: Annotated[str | None, typer.Option(help="identifier the key holds (default: the data map's)")
                          ] = None,
    starting_offsets: Annotated[str, typer.Option(help="Kafka: where a new query starts, earliest | latest | Spark's "
                                                       "per-partition JSON (a restart resumes from its checkpoint)")
                                ] = "earliest",
    option: Annotated[list[str] | None, typer.Option(help="a Spark source option, NAME=VALUE (maxOffsetsPerTrigger=..."
                                                          "); repeat for more")] = None,
) -> None:
    """Stream files or a Kafka topic into a table, exactly once, dropping rows of people who asked to be erased."""
    from .drop.screening import listed_rows
    from .ingest.stream import ingest as run_ingest
    from .ingest.stream import suppressed_counts

    def batch(progress: dict) -> None:
        rows_in, kept = suppressed_counts(progress)
        listed = listed_rows(progress)
        console.print(f"batch {progress['batchId']}: {rows_in:,} rows read, "
                      f"{rows_in - kept:,} of erased subjects dropped"
                      + (f", {listed:,} carrying a DROP work item's hash" if listed else ""))

    options = dict(_name_value(o, "--option") for o in option or [])
    result = run_ingest(_spark(), _settings(), source, fmt, table, checkpoint, once, key, identifier, options, batch,
                        starting_offsets)
    console.print(f"{result.batches} batch(es): {result.rows_in:,} rows read, {result.rows_suppressed:,} dropped "
                  f"(erased subjects), {result.rows_written:,} appended to {table}")
    if result.drop_listed:
        m = result.drop_matched
        console.print(f"DROP: {m.get('one_person', 0) + m.get('several_people', 0)} waiting work item(s) matched; "
                      f"requests filed: {m.get('erase_requests', 0)} erase, {m.get('opt_out_requests', 0)} opt-out "
                      "(dsr run carries them out; dsr drop export reports the new statuses)")


@app.command()
def risk(
    table: Annotated[str, typer.Argument(help="namespace.table")],
    quasi: Annotated[str, typer.Option(help="quasi-identifier columns, comma-separated (zip,birth_date,gender)")],
    k: Annotated[int, typer.Option(help="the smallest class size you accept")] = 5,
    sensitive: Annotated[str | None, typer.Option(help="a sensitive column: report its l-diversity")] = None,
    subject: Annotated[str | None, typer.Option(help="column naming the person (default: the data-map key)")
                       ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    plot: Annotated[Path | None, typer.Option(help="write a chart of class sizes (PNG) here")] = None,
) -> None:
    """k-anonymity of a table over its quasi-identifiers (and l-diversity of a sensitive column): counts only."""
    from .vault.risk import assess
    from .vault.risk import plot as plot_classes

    found = assess(_spark(), _settings(), table, [c.strip() for c in quasi.split(",") if c.strip()], k,
                   sensitive, subject)
    if plot:
        plot_classes(found, plot)
    if as_json:
        print(json.dumps(found.as_dict(), indent=2))
        return
    verdict = "[green]k-anonymous[/]" if found.k_anonymous else "[red]not k-anonymous[/]"
    console.print(f"{table} over {', '.join(found.quasi_identifiers)}: {verdict} for k={k}; {found.rows:,} rows in "
                  f"{found.classes:,} classes, the smallest of {found.smallest_class}")
    console.print(f"rows in classes below k: {found.rows_below_k:,} ({found.share_rows_below_k:.1%})")
    if found.subjects is not None:
        console.print(f"subjects ({found.subject_column}) in classes below k: {found.subjects_below_k:,} of "
                      f"{found.subjects:,} ({found.share_subjects_below_k:.1%})")
    if found.sensitive:
        console.print(f"l-diversity of {found.sensitive}: {found.l_diversity} (rows in classes with one value: "
                      f"{found.share_rows_single_value:.1%})")
    for c in found.riskiest:
        console.print(f"  {', '.join(c.columns)}: smallest class {c.smallest_class}, "
                      f"{c.share_rows_below_k:.1%} of rows below k")


@app.command()
def pseudonymize(
    source: Annotated[str, typer.Argument(help="namespace.table to copy")],
    into: Annotated[str, typer.Option(help="the new table: namespace.table (must not exist)")],
    key: Annotated[str, typer.Option(help="the column naming the person; it will hold pseudonyms")],
    identifier: Annotated[str | None, typer.Option(help="the identifier type the key holds (default: from the "
                                                        "data map, else its subject)")] = None,
    encrypt: Annotated[str | None, typer.Option(help="string/binary columns to encrypt per person, comma-separated"
                                                )] = None,
    table_format: Annotated[TableFormat, typer.Option("--format", help="iceberg | delta (under delta.warehouse)")
                            ] = "iceberg",
) -> None:
    """Copy a table with its key as vault pseudonyms and columns encrypted per person; print the data-map entry."""
    import yaml

    from .vault.pseudonymize import pseudonymize_table

    columns = [c.strip() for c in (encrypt or "").split(",") if c.strip()]
    with err.status(f"pseudonymizing {source} into {into}"):
        done = pseudonymize_table(_spark(), _settings(), source, into, key, identifier, columns, table_format)
    err.print(f"{done.target}: {done.rows:,} rows, {done.entries_created:,} new vault entries; add to the data map "
              "(and keep or erase the source as its own entry says):")
    print(yaml.safe_dump({"datamap": {"tables": done.datamap_entry()}}, sort_keys=False), end="")


@app.command("rotate-vault-key")
def rotate_vault_key() -> None:
    """Wrap every vault data key under a new master key (no fact table changes); the old key is then dropped."""
    from .vault.vault import rotate_master_key

    with err.status("re-wrapping the vault's data keys"):
        r = rotate_master_key(_spark(), _settings())
    console.print(f"vault master key {r.new_id} is now active; {r.entries_rewrapped:,} data key(s) re-wrapped, "
                  f"{r.retired_dropped} retired master key(s) no entry needs were dropped")


@app.command()
def discover(
    namespace: Annotated[list[str] | None, typer.Option(help="namespace to look in (default: all but the ledger's)")
                         ] = None,
    sample: Annotated[int, typer.Option(min=10, help="rows sampled per table")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """List columns that probably hold personal data and are not in the data map, with the evidence."""
    from .inventory.discover import discover as find

    findings = find(_spark(), _settings(), namespace, sample)
    if as_json:
        print(json.dumps([f.as_dict() for f in findings], indent=2))
        return
    summary = Table(title=f"{len(findings)} unmapped column(s) that probably hold personal data")
    for column in ("table", "column", "evidence", "share", "data-map entry"):
        summary.add_column(column, overflow="fold")
    for f in findings:
        summary.add_row(f.table, f.column, f.evidence, "–" if f.share is None else f"{f.share:.0%}", escape(f.entry))
    console.print(summary)


@app.command()
def bench(
    events: Annotated[int, typer.Option(min=1000, help="events (the notebook: 10,000,000)")] = 1_000_000,
    users: Annotated[int | None, typer.Option(min=1, help="default: events / 100, as in the notebook")] = None,
    erase: Annotated[int, typer.Option(min=1, help="erase requests")] = 100,
    access: Annotated[int, typer.Option(min=0, help="access requests")] = 1000,
    results: Annotated[Path, typer.Option(help="where the JSON and charts go")] = Path("bench/results"),
    repeats: Annotated[int, typer.Option(min=1, help="rounds (rebuilt each round); medians are reported")] = 1,
) -> None:
    """Run the notebook's steps and `dsr run` on identical data; write JSON and charts."""
    from .bench import run_bench

    users = users or max(erase + access, events // 100)
    with Bars() as bars:
        out = run_bench(_spark(), _settings(), events, users, erase, access, results, progress=bars, repeats=repeats)
    sides = {"notebook s": out["side_a_notebook"], "dsr s": out["side_b_dsr_events"],
             "dsr batched s": out["side_b_dsr_events_batched"]}
    table = Table(title=f"{events:,} events: notebook vs dsr run (events table, verified; medians of {repeats})")
    table.add_column("stage")
    for column in sides:
        table.add_column(column, justify="right")
    for stage in dict.fromkeys(k for side in sides.values() for k in side["seconds"]):
        table.add_row(stage, *(str(side["seconds"].get(stage, "")) for side in sides.values()))
    table.add_row("full cycle", *(str(side["full_cycle_s"]) for side in sides.values()))
    console.print(table)
    console.print(f"ratios: {out['ratios']}")
    console.print(f"targets met: {out['targets_met']}; results in {results}")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8080,
    forwarded_allow_ips: Annotated[str | None, typer.Option(
        help="reverse proxies whose X-Forwarded-For is trusted (default: 127.0.0.1)")] = None,
) -> None:
    """Serve the intake API, the request pages and the operator dashboard (no JVM); acknowledged
    requests reach the ledger within seconds. Operators authenticate with a named token (`dsr operator
    add`), $DSR_API_TOKEN or a JWT. SIGTERM or SIGINT stop it cleanly."""
    from .service.server import serve as run_server

    run_server(_settings(), host, port, forwarded_allow_ips)


# -- dsr operator: named operator tokens (service/operators.py) --------------------------------------
operator_app = typer.Typer(no_args_is_help=True, help="Named operator tokens for `dsr serve`'s operator API.")
app.add_typer(operator_app, name="operator")


@operator_app.command("add")
def operator_add(
    name: str,
    expires: Annotated[str | None, typer.Option(help="last day it works, YYYY-MM-DD (UTC), or an ISO-8601 time "
                                                     "(default: never expires)")] = None,
) -> None:
    """Add an operator and print its token, once: only its SHA-256 is kept. A running server accepts it at once."""
    from .service.operators import add_operator, expiry, operators_file

    token = add_operator(operators_file(_settings()), name, expiry(expires) if expires else None)
    err.print(f"operator {escape(name)} added; its token (shown once, send it as Authorization: Bearer):")
    print(token)


@operator_app.command("list")
def operator_list(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """Every named operator: created, expiry, and whether the token still works (never the token)."""
    from datetime import UTC, datetime

    from .service.operators import list_operators, operators_file

    found, now = list_operators(operators_file(_settings())), datetime.now(UTC)
    rows = [{"name": r.name, "created": r.created.isoformat(), "expires": r.expires.isoformat() if r.expires
             else None, "active": not r.expired(now)} for r in found]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="operators")
    for column in ("name", "created", "expires", "active"):
        table.add_column(column)
    for r in found:
        table.add_row(escape(r.name), r.created.isoformat(), r.expires.isoformat() if r.expires else "never",
                      "no" if r.expired(now) else "yes")
    console.print(table if found else "no named operators")


@operator_app.command("revoke")
def operator_revoke(name: str) -> None:
    """Revoke an operator's token: it stops working at once; every other operator keeps theirs."""
    from .service.operators import operators_file, revoke_operator

    revoke_operator(operators_file(_settings()), name)
    console.print(f"operator {escape(name)} revoked")


# -- dsr webhooks: status changes told to other tools (service/webhooks.py) ---------------------------
webhooks_app = typer.Typer(no_args_is_help=True, help="Signed webhooks on request status changes (`webhooks:`).")
app.add_typer(webhooks_app, name="webhooks")


@webhooks_app.command("deliver")
def webhooks_deliver() -> None:
    """One round without `dsr serve` (from cron, say): copy the ledger's new status changes into the outbox,
    then attempt every delivery that is due. Prints what it did as JSON."""
    from .service.webhooks import deliver_once

    print(json.dumps(deliver_once(_settings())))


@webhooks_app.command("log")
def webhooks_log(limit: Annotated[int, typer.Option(min=1, help="attempts to show, newest first")] = 50) -> None:
    """The delivery log as JSON: event, endpoint, attempt, HTTP status or error, when (no subject identifier)."""
    from .service.queue import open_queue
    from .service.webhooks import delivery_log

    queue = open_queue(_settings())
    try:
        print(json.dumps(delivery_log(queue, limit), indent=2))
    finally:
        queue.close()


# -- dsr drop: California's DROP lists (drop/) ---------------------------------------------------------
drop_app = typer.Typer(no_args_is_help=True, help="California's DROP: import downloads of hashed deletion lists, "
                                                  "see where the cycle stands.")
app.add_typer(drop_app, name="drop")


@drop_app.command("import")
def drop_import(download: Annotated[Path, typer.Argument(help="the ZIP DROP gave (YYYYMMDD_BROKER_DROP.zip)")]) -> None:
    """File a DROP download's work items in the ledger (checked whole first: a malformed download is
    refused with the file, line and reason, and nothing is filed; nothing is filed twice)."""
    from .drop.items import import_download

    settings = _settings()
    result = import_download(Ledger(settings), download, settings.drop)
    lists = ", ".join(f"{name} {count}" for name, count in result.lists.items()) or "no list"
    again = " (imported before)" if result.repeated else ""
    console.print(f"{escape(result.download)}{again}: {lists}; {result.filed} work item(s) filed, "
                  f"{result.already_filed} already filed, {result.withdrawn} withdrawn; due {result.due_date}")


@drop_app.command("match")
def drop_match() -> None:
    """Match the work items waiting for it against the lake, in Spark (the identifiers the data map's
    `drop:` section places, standardized and hashed as DROP does): one person -> an erase request (the
    next `dsr run` erases them), several -> each opted out of sale/sharing, nobody -> status 5."""
    from .drop.matching import match_items
    from .lake.lakehouse import Lake

    settings = _settings()
    result = match_items(Lake.of(_spark(), settings), Ledger(settings), settings)
    console.print(f"{result.items} work item(s) matched: {result.one_person} to one person, {result.several_people} "
                  f"to several, {result.not_found} to nobody (status 5); requests: {result.erase_requests} erase, "
                  f"{result.opt_out_requests} opt-out")


@drop_app.command("sample")
def drop_sample(
    out: Annotated[Path, typer.Argument(help="the ZIP to write (owner-only)")],
    people: Annotated[int, typer.Option(min=0, help="work items per list naming people of the lake")] = 20,
    unknown: Annotated[int, typer.Option(min=0, help="work items per list naming nobody")] = 5,
    day: Annotated[str | None, typer.Option(help="the download's day, YYYY-MM-DD (default: today, UTC)")] = None,
    broker: Annotated[str, typer.Option(help="the broker id in the file names (four digits)")] = "0000",
    seed: Annotated[int, typer.Option(help="which people: the same lake and seed pick the same")] = 42,
) -> None:
    """Write a DROP download built from the lake's own identifiers (hashed in Spark, as a match does),
    to try a whole cycle (import, run, export) before DROP sends one."""
    from .drop.sample import sample_download
    from .lake.lakehouse import Lake

    try:
        when = date.fromisoformat(day) if day is not None else None
    except ValueError:
        raise DsrError(f"--day: {day!r} is not a date (YYYY-MM-DD)") from None
    settings = _settings()
    result = sample_download(Lake.of(_spark(), settings), settings, out, people, unknown, when, broker, seed)
    for list_name, found in result.people.items():
        console.print(f"{list_name}: {found} of the lake's people, {result.unknown[list_name]} of nobody")
    console.print(f"written: {result.path}")


@drop_app.command("export")
def drop_export(out: Annotated[Path, typer.Option(help="folder for the files to upload (owner-only)")]) -> None:
    """Write the files to upload to DROP: first statuses per download and list (`POST /data/upload`) and
    statuses changed since they were written (`POST /data/amend`); work items are settled from their
    requests first (erased 3, held 2, opted out 4; nobody found: 5)."""
    from .drop.items import export_answers

    result = export_answers(_ledger(), out)
    for kind, files in (("upload", result.uploads), ("amend", result.amendments)):
        for name, count in files.items():
            console.print(f"{kind}: {out / name} ({count} work item(s))")
    if not result.uploads and not result.amendments:
        console.print("nothing new to send")
    console.print(f"{result.pending} work item(s) still pending")


@drop_app.command("status")
def drop_status_cmd(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """The last download, work items per state, the days left before DROP must be accessed again and the
    next processing deadline."""
    from dataclasses import asdict

    from .drop.items import drop_status

    settings = _settings()
    result = drop_status(Ledger(settings), settings.drop)
    if as_json:
        print(json.dumps(asdict(result), default=str, indent=2))
        return
    if result.last_download is None:
        console.print("no DROP download imported yet: `dsr drop import DOWNLOAD.zip`")
        return
    console.print(f"last download {escape(result.last_download)} ({result.last_download_day}), imported "
                  f"{result.last_access:%Y-%m-%d %H:%M} UTC")
    console.print("work items: " + ", ".join(f"{name} {count}" for name, count in result.items.items()))
    console.print(f"next access of DROP due by {result.next_access_by} ({result.days_left_in_cycle} days left); "
                  f"next processing deadline: {result.next_deadline or 'none (nothing pending)'}")


@app.command()
def demo(
    users: Annotated[int, typer.Option(min=1)] = 10_000,
    events: Annotated[int, typer.Option(min=0, help="up to the notebook's 10,000,000")] = 1_000_000,
    erase: Annotated[int, typer.Option(min=1, help="erase requests to submit")] = 100,
    access_requests: Annotated[int, typer.Option("--access", min=0, help="access requests to submit")] = 10,
    seed: int = 42,
    report: Annotated[Path, typer.Option(help="JSON run report")] = Path("reports/demo-run.json"),
    table_format: Annotated[TableFormat, typer.Option("--format", help="iceberg | delta (under delta.warehouse)")
                            ] = "iceberg",
) -> None:
    """Generate the demo lakehouse, submit erase and access requests, run them, show the ledger."""
    from . import synth
    from .datamap import demo_datamap

    settings = _demo_settings(table_format)
    if settings.datamap == demo_datamap():  # the embedded map: the demo also enforces the events' 25 months
        settings = _state["settings"] = settings.replace(datamap=demo_datamap(expire=True))
    spark = _spark()
    with Bars() as bars:
        synth.generate(spark, settings, users, events, seed, None, bars, table_format=table_format)
    rng = random.Random(seed)
    unknown = max(1, erase // 20)  # subjects no table knows: they must complete too
    picks = rng.sample(range(users), min(users, erase - unknown + access_requests))
    erased = [synth.user_id(seed, i) for i in picks[access_requests:]]
    erased += [synth.user_id(seed, users + k) for k in range(unknown)]
    inputs = [RequestInput(s, "erase", "ccpa" if i % 4 == 0 else "gdpr") for i, s in enumerate(erased)]
    inputs += [RequestInput(synth.user_id(seed, i), "access") for i in picks[:access_requests]]
    # One more person asks to be erased while a litigation hold keeps their records: the run leaves it `held`.
    # (Someone no table holds: the retention rule on the events, which a held person's rows would stop, runs.)
    ledger = Ledger(settings)
    litigant = synth.user_id(seed, users + unknown)
    add_hold(ledger, "litigation hold (demo): keep this customer's records", "demo", subject=litigant)
    submitted = ledger.submit([*inputs, RequestInput(litigant, "erase")])
    console.print(f"submitted {len(submitted.created)} requests: {len(erased) + 1} erase "
                  f"({unknown} for subjects found in no table, 1 under a legal hold: `dsr hold list`), "
                  f"{access_requests} access")
    run_cmd(report)
    console.print(f"run report: {report}")
    status()


def _demo_settings(table_format: TableFormat) -> Settings:
    """The settings, with the embedded demo map's tables in Delta for `--format delta` (for this
    command: a `dsr.yaml` maps the Delta demo for the commands after it, see datamap/delta.md)."""
    from .datamap import demo_datamap

    settings = _settings()
    if table_format == "delta" and settings.datamap == demo_datamap():
        settings = _state["settings"] = settings.replace(datamap=demo_datamap(table_format="delta"))
    return settings


def entry() -> None:
    _collect_less()
    try:
        # Not standalone, Click returns the code of a `typer.Exit` (exit 1: run or check failed) instead of raising it
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except typer.TyperException as exc:  # Click's own: unknown command or option, bad value: usage, exit 2
        exc.show()  # type: ignore[attr-defined]  # each is typer's vendored ClickException, which has show()
        sys.exit(exc.exit_code)
    except LedgerBusyError as exc:  # another run holds the ledger: a distinct code, so schedulers can retry
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(3)
    except DsrError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)  # messages hold file names, not markup
        sys.exit(2)
    except Exception as exc:
        if not disk_full(exc):
            raise
        # Commits are whole or absent: what the run did not record stays open for the next one.
        err.print(f"[red]error:[/] the disk is full (No space left on device); free space where this command "
                  f"writes: {escape(_free_space())}. Nothing half-written was committed: free some space and run "
                  "again.", soft_wrap=True)
        sys.exit(1)
    finally:
        _leave()


def _free_space() -> str:
    """The local places a command writes (the warehouse, Delta's warehouse, the exports, the temporary
    folder Spark spills to) with the space free on each, for a disk-full message."""
    settings = _state.get("settings")
    places = [Path(tempfile.gettempdir())]
    if isinstance(settings, Settings):
        places += [p for p in (settings.catalog.local_warehouse(), Path(settings.delta.warehouse)
                               if "://" not in settings.delta.warehouse else None,
                               Path(settings.export.directory)) if p is not None]
    free = {}
    for place in places:
        existing = next((p for p in (place, *place.parents) if p.exists()), None)
        if existing is not None:
            free[str(place)] = shutil.disk_usage(existing).free
    return ", ".join(f"{place} {decimal(n)} free" for place, n in free.items())


@functools.cache
def _collect_less() -> None:
    """Python's cyclic collector walks every object at each full collection and several times at exit:
    0.3 s of a tiny run, 0.35 s of its exit. What exists now (the modules imported) lives as long as
    the process, so it is set aside (`gc.freeze`) now and everything again at exit; exit frees memory
    without collecting it."""
    gc.freeze()
    atexit.register(gc.freeze)  # atexit runs before the interpreter's final collections
