"""Load and validate `dsr.yaml`: Spark settings, catalog, data map, purge policy.

Without a file the demo's configuration applies: `local[*]` Spark, an Iceberg hadoop catalog
named `lakehouse` with its warehouse at `./lakehouse`, and the demo's data map (demo/datamap.yaml).
A file of one's own has no data map but its `datamap:` section: without one, the commands that
read or change mapped tables refuse (Settings.datamap), the others (the ledger, the service) work.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self, cast, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from .datamap import DataMap, demo_datamap
from .exceptions import ConfigError

DEFAULT_CONFIG_FILE = "dsr.yaml"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" would let a trailing newline through
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Strict(BaseModel):
    # Frozen: settings are read by many stages and threads; a change is a new object (Settings.replace).
    model_config = ConfigDict(extra="forbid", frozen=True)


def _as_str_map(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of names to values")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


# Spark and catalog properties: YAML numbers and flags are accepted and kept as the strings Spark and
# the catalogs read (`true`, not `True`); the published schema says so.
StrMap = Annotated[dict[str, str], BeforeValidator(_as_str_map), WithJsonSchema(
    {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}})]


class SparkSettings(_Strict):
    master: str = "local[*]"
    app_name: str = "lakehouse-dsr"
    conf: StrMap = Field(default_factory=dict)
    # Where the table formats' jars (Iceberg runtime, Delta) come from: "maven", the engine's own,
    # fetched from Maven Central once (lake/jars.py); "provided", none from the engine: the cluster,
    # `--packages` or spark.conf's spark.jars / spark.jars.packages brings Iceberg and Delta.
    format_jars: Literal["maven", "provided"] = "maven"


class CatalogSettings(_Strict):
    name: str = "lakehouse"
    properties: StrMap = Field(default_factory=lambda: {"type": "hadoop", "warehouse": "lakehouse"})

    # Extra pyiceberg properties for the control plane (dsr submit/status/extend, the ledger), which
    # reads and writes the ledger without a JVM; normally derived from `properties` (see lake/catalog.py).
    pyiceberg: StrMap = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"catalog name {v!r} must be a plain identifier (letters, digits, _)")
        return v

    def quoted(self, name: str) -> str:
        """Fully qualified, quoted name of a table (`namespace.table`) or namespace of this catalog, for SQL text."""
        return ".".join(f"`{part}`" for part in [self.name, *name.split(".")])

    def local_warehouse(self) -> Path | None:
        """The warehouse directory when it lives on the local file system, else None.

        A REST catalog's `warehouse` names a warehouse on the server, never a path.
        """
        if self.properties.get("type") == "rest":
            return None
        wh = self.properties.get("warehouse", "")
        if wh.startswith("file:"):
            return Path(re.sub(r"^file:/*", "/", wh))
        return Path(wh) if wh and "://" not in wh else None


class PurgeSettings(_Strict):
    # Orphan files younger than this may belong to a writer still committing; never touch them.
    orphan_min_age_minutes: float = Field(default=60.0, ge=0)
    # A tag or branch pinning a snapshot that holds erased rows: block the request; drop such tags; or
    # rewrite them (re-pointed to a cleaned copy of their snapshot). Under drop and rewrite such a branch
    # is erased in place, never dropped, and a ref holding no erased row is left alone (stages/refs.py).
    pinned_refs: Literal["block", "drop", "rewrite"] = "block"
    # immediate: purge in the run that erases. batched: erase logically at once, then purge many
    # runs' requests in one rewrite, before any of them comes within the margin of its due date.
    policy: Literal["immediate", "batched"] = "immediate"
    max_delay_days: int = Field(default=7, ge=0)  # longest a logically erased request waits
    safety_margin_days: int = Field(default=3, ge=0)  # purged and proven this long before due
    # Size of the files the purge writes. Iceberg's 512 MB default turns a table under 512 MB
    # into one file written by one task; smaller files keep every core busy, now and next time.
    target_file_size_mb: int = Field(default=128, ge=1)


ExportFormat = Literal["json", "csv", "parquet"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)


class ExportSettings(_Strict):
    directory: Path = Path("exports")  # one sub-folder per run; relative to the config file's folder
    format: ExportFormat = "json"


class EraseSettings(_Strict):
    # Above this many identifiers per table the key set is not broadcast (see erase.choose_strategy).
    broadcast_max_keys: int = Field(default=1_000_000, ge=0)
    # content: count + order-independent hash of every row not requested, before and after each erase
    # commit (one extra scan of each side); count: row counts from commit metadata only.
    collateral_check: Literal["content", "count"] = "content"
    # A commit invalidated by a concurrent writer is retried with exponential backoff, this many times.
    commit_retries: int = Field(default=4, ge=0)
    retry_backoff_seconds: float = Field(default=1.0, ge=0)
    # Rows of a requested subject appended during the run are erased again, in at most this many rounds.
    max_rounds: int = Field(default=3, ge=1)
    # A table whose files to read for the plan or the rewrite add up to at most this many bytes is
    # read and rewritten inside the driver's JVM (lake/indriver.py), without a Spark query; 0: never.
    in_driver_max_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    # A merge-on-read deletion (format v2) whose plan finds at most this many rows writes their position
    # deletes from the driver, at the positions the plan's scan found: no second read of the table.
    # More rows (or 0) leave the deletion to Spark's statement.
    max_delete_positions: int = Field(default=1_000_000, ge=0)
    # A batch of at most this many requests (and its identifiers' hashes) is held in the driver's JVM,
    # where resolving, grouping and hashing it takes no Spark job; a larger one stays in Spark (lake/
    # frames.py): shuffle joins, no data skipping by value. 100,000 ran in a 1 GB driver, a million did not.
    in_driver_max_requests: int = Field(default=100_000, ge=0)


class RunSettings(_Strict):
    # A second `dsr run` while another holds the ledger: exit 3 at once, or wait for it.
    concurrent: Literal["wait", "fail"] = "fail"
    # The lease a run holds on the ledger lapses this long after its last heartbeat (a killed run's
    # lease blocks others at most this long; on the same host a dead holder is noticed at once).
    lease_seconds: float = Field(default=120.0, ge=2)
    # Tables erased, purged and verified at once (Spark jobs and commits of one session, in threads), and
    # tables whose part of the access export's query is built at once.
    parallel_tables: int = Field(default=4, ge=1)


class SmtpSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=25, ge=1, le=65535)
    sender: str = "privacy@localhost"
    starttls: bool = False
    username: str | None = None  # with password: SMTP AUTH (put the password in ${ENV}, not in the file)
    password: str | None = None
    timeout_seconds: float = Field(default=10.0, gt=0)


JwtAlgorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


class JwtSettings(_Strict):
    """Operators holding a JWT (`intake.jwt`): tokens signed by a key of the JWKS are accepted."""

    jwks: str  # a JWKS file, or its https:// URL (keys cached; fetched again for an unknown key id)
    issuer: str | None = None  # when set, the token's `iss` must be this
    audience: str | None = None  # when set, the token's `aud` must name this
    name_claim: str = "sub"  # the claim that names the operator in the audit (as jwt:<value>)
    # Asymmetric algorithms only: a shared secret has no place in a JWKS that others may read.
    algorithms: tuple[JwtAlgorithm, ...] = Field(default=("RS256", "ES256"), min_length=1)
    leeway_seconds: float = Field(default=30.0, ge=0)  # clock skew allowed on exp and nbf


class IntakeSettings(_Strict):
    """`dsr serve`: the HTTP intake service (service/)."""

    # email_code: erase and access requests wait as identity_unverified until the code mailed to the
    # person comes back (opt-outs never wait: CCPA forbids verifying them).
    verification: Literal["none", "email_code"] = "none"
    smtp: SmtpSettings = Field(default_factory=SmtpSettings)
    code_ttl_minutes: float = Field(default=15.0, gt=0)
    max_code_attempts: int = Field(default=5, ge=1)  # wrong codes before the request is locked
    rate_limit_per_minute: int = Field(default=600, ge=0)  # per client address; 0: no limit
    max_body_bytes: int = Field(default=16_384, ge=256)
    # The durable queue of acknowledged requests (SQLite); default: beside the HMAC key file.
    queue_file: Path | None = None
    # Or the queue on a PostgreSQL server, which several `dsr serve` instances then share (one ingester at
    # a time, one rate limit): postgresql://user@host:port/database (the password from ~/.pgpass,
    # $PGPASSWORD, or ${ENV} in the URL). Instead of queue_file, never with it.
    queue_url: str | None = Field(default=None, pattern=r"^postgres(ql)?://")
    ingest_interval_seconds: float = Field(default=2.0, gt=0)  # acknowledged requests reach the ledger this often
    cors_origins: list[str] = Field(default_factory=list)  # none: browsers allow same-origin pages only
    # Named operators' hashed tokens (`dsr operator add`); default: dsr-operators.json beside the key file.
    operators_file: Path | None = None
    jwt: JwtSettings | None = None  # operators may also present a JWT verified against this JWKS

    @model_validator(mode="after")
    def _one_queue(self) -> IntakeSettings:
        if self.queue_file is not None and self.queue_url is not None:
            raise ValueError("give intake.queue_file (SQLite) or intake.queue_url (PostgreSQL), not both")
        return self


WebhookEvent = Literal["received", "verified", "held", "completed", "failed"]
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = get_args(WebhookEvent)


class WebhookSettings(_Strict):
    """One endpoint that is told of request status changes (`webhooks:`; service/webhooks.py): each event
    is POSTed as JSON, signed with HMAC-SHA256 under `secret`, and retried with exponential backoff."""

    # Names the endpoint in the delivery log (a URL may carry a token of its own, so the log never holds it).
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,60}$")
    url: str = Field(pattern=r"^https?://")
    secret: str = Field(min_length=16)  # put it in ${ENV}, not in the file
    events: tuple[WebhookEvent, ...] = Field(default=WEBHOOK_EVENTS, min_length=1)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)  # per attempt: connect, send, and each read
    max_attempts: int = Field(default=8, ge=1, le=50)  # then the delivery is given up (and logged as such)
    backoff_seconds: float = Field(default=30.0, ge=0)  # before the 2nd attempt; doubled after each, up to 6 h


class RecordSettings(_Strict):
    """How long our own records are kept (ledger/records.py: `dsr run` and `dsr expire-records`)."""

    # A completed request's record (its row, keys, audit events, evidence) leaves the ledger and its
    # history this many months after completion: CCPA (Cal. Code Regs. tit. 11, § 7101) keeps 24.
    keep_completed_months: int = Field(default=24, ge=1)
    # An expired erase request's keyed hashes stay (table erased_keys), so suppression and the
    # resurrection check keep the person out; false: they go with the record, and the person may come back.
    keep_erased_hashes: bool = True
    # An access package is deleted this many days after it was written (its file's modification time).
    keep_packages_days: int = Field(default=30, ge=0)
    # An intake request never verified (or locked after wrong codes) is dropped with its identifiers.
    keep_unverified_days: int = Field(default=30, ge=1)


class DropSettings(_Strict):
    """California's DROP (`drop:`; drop/): the cycle and the choices its spec leaves open."""

    # A broker must access DROP at least this often (Civ. Code 1798.99.86(c)(1): 45 days; AB 883 is
    # reported to make it 30 from 2027) ...
    interval_days: int = Field(default=45, ge=1)
    # ... and process a download's requests within this many days of it.
    processing_days: int = Field(default=45, ge=1)
    # How a ZIP+4 is recognised before its +4 is dropped (drop/hashing.py's Rules): nine digits once
    # punctuation is gone, or written ddddd-dddd.
    zip_plus4: Literal["nine_digits", "hyphenated"] = "nine_digits"
    # A work item DROP withdrew (its Removed file) leaves the ledger, ID and hash, once withdrawn for
    # `records.keep_completed_months` (ledger/records.py); true: it stays on the suppression list. The
    # spec does not say whether a withdrawal ends suppression.
    keep_withdrawn: bool = False


class DeltaSettings(_Strict):
    """Where Delta tables live (`delta:`). A data-map table with `format: delta` and no `path:` is at
    `<warehouse>/<namespace>/<table>` (relative to the config file's folder), or, with `catalog`, the
    table of that name in that Spark catalog (a metastore behind Delta's DeltaCatalog, e.g.
    `spark_catalog`), at the location the metastore records."""

    warehouse: str = "delta"
    catalog: str | None = None

    @field_validator("catalog")
    @classmethod
    def _plain_catalog(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError(f"delta.catalog {v!r} must be a plain identifier (letters, digits, _)")
        return v


def _property_names(names: Mapping[str, Any]) -> None:
    for name in names:
        if not re.match(r"^[a-z][a-z0-9._-]*\Z", name):
            raise ValueError(f"{name!r} is not a Kafka client property name")


class KafkaSettings(BaseModel):
    """The Kafka cluster holding the data map's topics (`kafka:`): `bootstrap_servers`, and beside it any
    other client property both clients share (`security.protocol`, `sasl.mechanism`, ...; secrets as
    ${ENV}), given as written to the engine's admin client (librdkafka) and, prefixed `kafka.`, to
    Spark's connector (the Java client). The two clients name some settings differently (librdkafka's
    `sasl.username`, `ssl.ca.location`; Java's `sasl.jaas.config`, `ssl.truststore.location`): those go
    under `admin:` (the admin client's only) or `spark:` (Spark's only)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    bootstrap_servers: str = Field(min_length=1)
    admin: StrMap = Field(default_factory=dict)
    spark: StrMap = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _as_strings(cls, data: Any) -> Any:
        """Client properties are text (`true`, not `True`), as the Kafka clients read them."""
        if not isinstance(data, dict):
            return data
        own = {k: data[k] for k in ("admin", "spark") if k in data}
        strings = _as_str_map({k: v for k, v in data.items() if k not in own})
        _property_names(strings)
        for section in own.values():
            _property_names(section if isinstance(section, dict) else {})
        return {**{k.replace(".", "_") if k == "bootstrap.servers" else k: v for k, v in strings.items()}, **own}

    def client_properties(self) -> dict[str, str]:
        """The properties both clients take, as Kafka names them (`bootstrap.servers`, ...)."""
        return {"bootstrap.servers": self.bootstrap_servers, **cast(dict[str, str], self.model_extra or {})}

    def admin_properties(self) -> dict[str, str]:
        """What the engine's admin client and producer (librdkafka) are given."""
        return {**self.client_properties(), **self.admin}

    def spark_properties(self) -> dict[str, str]:
        """What Spark's Kafka connector (the Java client) is given, without the `kafka.` prefix."""
        return {**self.client_properties(), **self.spark}


class Settings(_Strict):
    """Everything `dsr.yaml` says, validated and frozen (load_settings, settings_from_dict; a variant
    is a copy: `replace`). Sections: spark, catalog, datamap, purge, erase, export, run, intake, records,
    drop, webhooks, kafka."""

    model_config = ConfigDict(serialize_by_alias=True)  # `datamap`, as written, in every dump

    spark: SparkSettings = Field(default_factory=SparkSettings)
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    delta: DeltaSettings = Field(default_factory=DeltaSettings)
    # The section as given, None when absent; read through `datamap`, which refuses a config without one.
    # Never a default: a forgotten section must not map tables that are not the user's (the demo's).
    datamap_: DataMap | None = Field(default=None, alias="datamap")
    purge: PurgeSettings = Field(default_factory=PurgeSettings)
    erase: EraseSettings = Field(default_factory=EraseSettings)
    export: ExportSettings = Field(default_factory=ExportSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    intake: IntakeSettings = Field(default_factory=IntakeSettings)
    records: RecordSettings = Field(default_factory=RecordSettings)
    drop: DropSettings = Field(default_factory=DropSettings)
    webhooks: list[WebhookSettings] = Field(default_factory=list)  # told of status changes
    kafka: KafkaSettings | None = None  # the cluster of the data map's `topics:`
    ledger_namespace: str = "dsr"
    demo_namespace: str = "demo"
    secret_key_file: Path | None = None
    _source: str = PrivateAttr(default="the configuration")  # the file's name, for the error of `datamap`

    @property
    def datamap(self) -> DataMap:
        """The data map (`datamap:`); ConfigError naming the missing section when the config has none."""
        if self.datamap_ is None:
            raise ConfigError(f"{self._source} has no datamap: section: name the tables that hold personal data "
                              "there (examples/dsr.yaml shows how); the demo's tables are mapped only when no "
                              "dsr.yaml is found")
        return self.datamap_

    @model_validator(mode="after")
    def _topics_have_a_cluster(self) -> Settings:
        if self.datamap_ is not None and self.datamap_.topics and self.kafka is None:
            raise ValueError("the data map lists topics: give the cluster that holds them, "
                             "kafka: {bootstrap_servers: HOST:PORT}")
        return self

    @field_validator("webhooks")
    @classmethod
    def _distinct_names(cls, v: list[WebhookSettings]) -> list[WebhookSettings]:
        names = [w.name for w in v]
        if len(set(names)) != len(names):
            raise ValueError("each webhook needs a name of its own (the delivery log tells them apart by it)")
        return v

    @field_validator("ledger_namespace", "demo_namespace")
    @classmethod
    def _plain_namespace(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"namespace {v!r} must be a plain identifier")
        return v

    def table(self, name: str) -> str:
        """Fully qualified, quoted name of a table given as `namespace.table`, for SQL text: a Delta
        table of the data map by its path (delta.`/path`) or in `delta.catalog` by name, any other
        through the catalog."""
        if name in self.delta_named():
            return ".".join(f"`{part}`" for part in [cast(str, self.delta.catalog), *name.split(".")])
        location = self.delta_tables().get(name)
        return delta_quoted(location) if location is not None else self.catalog.quoted(name)

    def delta_named(self) -> list[str]:
        """The data map's Delta tables found by name in `delta.catalog` (`format: delta`, no `path:`);
        none without that catalog. Their locations are the metastore's (Lake.of asks Spark)."""
        if self.datamap_ is None or self.delta.catalog is None:
            return []
        return [name for name, mapping in {**self.datamap_.tables, **self.datamap_.derived}.items()
                if mapping.format == "delta" and not mapping.path]

    def delta_tables(self) -> dict[str, str]:
        """The data map's Delta tables (mapped and derived) reached by path -> their locations: `format:
        delta`, a `path:`, or (format omitted) a Delta log at `<delta.warehouse>/<namespace>/<table>`
        (those `delta_named` finds by name aside). Checks the local file system only for tables whose
        format is omitted; none without a data map."""
        if self.datamap_ is None:
            return {}
        found = {}
        named = set(self.delta_named())
        for name, mapping in {**self.datamap_.tables, **self.datamap_.derived}.items():
            if mapping.format == "iceberg" or name in named:
                continue
            location = mapping.path or self.delta_location(name)
            if mapping.format == "delta" or mapping.path or _is_delta(location):
                found[name] = location
        return found

    def delta_location(self, name: str) -> str:
        """Where a path-less Delta table `namespace.table` lives: `<delta.warehouse>/<namespace>/<table>`."""
        return _join(self.delta.warehouse, *name.split("."))

    def namespace(self, name: str) -> str:
        return self.catalog.quoted(name)

    def key_file(self) -> Path:
        """Where the HMAC key lives when DSR_SECRET_KEY is not set: next to a local warehouse."""
        if self.secret_key_file:
            return self.secret_key_file
        wh = self.catalog.local_warehouse()
        return (wh.parent if wh else Path.cwd()) / "dsr-secret.key"

    def intake_queue_file(self) -> Path:
        return self.intake.queue_file or self.key_file().parent / "dsr-intake.db"

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`; a section given as a dict changes only the fields it names
        (`settings.replace(export={"format": "csv"})`). Values are taken as given, not validated
        again: for code that holds typed values, not for user input (settings_from_dict)."""
        updates = {}
        for name, value in changes.items():
            current = self.datamap_ if name == "datamap" else getattr(self, name)
            updates[name] = current.model_copy(update=value) if isinstance(value, dict) and isinstance(
                current, BaseModel) else value
        return self.model_copy(update=updates)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """As pydantic's, with `datamap` in `update` (the name written) setting the data map."""
        if update and "datamap" in update:
            update = {("datamap_" if name == "datamap" else name): value for name, value in update.items()}
        return super().model_copy(update=update, deep=deep)


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _is_delta(location: str) -> bool:
    """Whether a local location holds a Delta log (remote ones are not probed: say `format: delta`)."""
    local = location.removeprefix("file:") if location.startswith("file:/") else location
    return "://" not in local and Path(local, "_delta_log").is_dir()


def delta_quoted(location: str) -> str:
    """A Delta table's location as Spark SQL names it: delta.`/path` (a backtick doubled)."""
    return "delta.`" + location.replace("`", "``") + "`"


def _local_location(location: str, base: Path) -> str:
    """A location without a scheme, made absolute from `base`; others (s3a://, file:/...) as given."""
    if "://" in location or location.startswith("file:"):
        return location
    return str((base / location).resolve())


def _absolutize(settings: Settings, base: Path) -> Settings:
    """Hadoop catalogs need an absolute URI; relative paths are read from the config's folder."""
    props = dict(settings.catalog.properties)
    wh = settings.catalog.local_warehouse()
    if wh and not props["warehouse"].startswith("file:"):
        props["warehouse"] = (base / wh).resolve().as_uri()
    sqlite = props.get("uri", "")
    if sqlite.startswith("jdbc:sqlite:") and not sqlite[len("jdbc:sqlite:"):].startswith(("/", "file:")):
        props["uri"] = f"jdbc:sqlite:{(base / sqlite[len('jdbc:sqlite:'):]).resolve()}"  # both planes: one file
    absolute = lambda path: path if path is None or path.is_absolute() else (base / path).resolve()  # noqa: E731
    jwt = settings.intake.jwt
    if jwt and not jwt.jwks.startswith(("https://", "http://")):
        jwt = jwt.model_copy(update={"jwks": str(absolute(Path(jwt.jwks)))})
    datamap = settings.datamap_
    if datamap is not None:  # Delta paths, as the warehouse, from the config's folder
        datamap = datamap.model_copy(update={section: {
            name: m.model_copy(update={"path": _local_location(m.path, base)}) if m.path else m
            for name, m in getattr(datamap, section).items()} for section in ("tables", "derived")})
    return settings.replace(catalog={"properties": props}, secret_key_file=absolute(settings.secret_key_file),
                            delta={"warehouse": _local_location(settings.delta.warehouse, base)}, datamap=datamap,
                            intake={"queue_file": absolute(settings.intake.queue_file), "jwt": jwt,
                                    "operators_file": absolute(settings.intake.operators_file)},
                            export={"directory": absolute(settings.export.directory)})


def demo_settings(base: Path | None = None) -> Settings:
    """The demo's configuration, used when no dsr.yaml is found: every default, and the demo's data map
    (demo/datamap.yaml); relative paths are read from `base`, default the working directory."""
    return _absolutize(Settings(datamap=demo_datamap()), base or Path.cwd())


def load_settings(path: str | Path | None = None) -> Settings:
    """Read `path` (or ./dsr.yaml if present); without either, the demo's configuration (demo_settings).
    A file without a `datamap:` section loads; the commands that need a data map then refuse it.

    Raises ConfigError with the offending field for malformed YAML or invalid values.
    """
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    if path is None:
        return demo_settings()
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {file} does not exist")
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file} is not valid YAML: {exc}") from None
    return settings_from_dict(expand_env(raw or {}, source=str(file)), base=file.resolve().parent, source=str(file))


def expand_env(raw: Any, source: str = "config") -> Any:
    """Replace `${NAME}` / `${NAME:-default}` in every string value with the environment's value.

    Secrets (S3 keys, catalog credentials) and per-host values (ports, jar folders) stay out of the
    file. An unset variable without a default is a ConfigError naming it (never its value).
    """
    if isinstance(raw, dict):
        return {key: expand_env(value, source) for key, value in raw.items()}
    if isinstance(raw, list):
        return [expand_env(value, source) for value in raw]
    if not isinstance(raw, str):
        return raw

    def value(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{source} refers to the environment variable {name}, which is not set")

    return _ENV_REF.sub(value, raw)


def settings_from_dict(raw: Any, base: Path | None = None, source: str = "config") -> Settings:
    """Settings from a mapping shaped like `dsr.yaml` (relative paths read from `base`, default the
    working directory); ConfigError naming every offending field, with `source` as the file's name."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{source} is invalid: {problems}") from None
    settings._source = source
    return _absolutize(settings, base or Path.cwd())
