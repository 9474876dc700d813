"""The catalog without a JVM: pyiceberg on the same catalog Spark uses, for the control plane.

`open_catalog(settings)` maps the `catalog:` section of dsr.yaml to a pyiceberg catalog:
- `type: jdbc` (SQLite or PostgreSQL): pyiceberg's SqlCatalog reads and writes the very tables
  of Iceberg's JDBC catalog (same database, same catalog name); a commit is a compare-and-set
  of the metadata pointer in the database.
- `type: rest`: pyiceberg's RestCatalog, with S3 settings taken from Spark's S3A configuration.
- `type: hadoop` (the embedded default): pyiceberg has no writable catalog for it, so
  `HadoopCatalog` below implements the layout Iceberg's Java HadoopCatalog uses (one folder per
  table, `metadata/vN.metadata.json`, `version-hint.text` kept for Java; the newest version is
  found by listing, not from the hint). A commit creates the next version's
  file with a hard link, which fails if that file exists: an atomic compare-and-set between
  processes on a local file system (Java's own commit checks, then renames).
Anything else (hive, glue, ...) is handed to pyiceberg as configured. `catalog.pyiceberg` in
dsr.yaml adds or overrides pyiceberg properties.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, cast
from urllib.parse import quote, urlparse

from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
)
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from ..exceptions import CatalogUnavailableError, ConfigError, first_line

if TYPE_CHECKING:
    from ..config import Settings

_VERSION = re.compile(r"v(\d+)(\.gz)?\.metadata\.json\Z")
_JAVA_ONLY = {"type", "catalog-impl", "io-impl", "rest.auth.type", "jdbc.schema-version", "cache-enabled",
              "cache.expiration-interval-ms", "jdbc.user", "jdbc.password", "uri", "lock-impl"}


def current_versions(settings: Settings, tables: list[str]) -> dict[str, int | None]:
    """Each table's current version, without a JVM (the control plane asks): an Iceberg table's
    snapshot id through pyiceberg (its metadata file read), a Delta table's newest commit from one
    listing of its `_delta_log` through pyarrow; None for an empty table, and for a Delta table on a
    scheme pyarrow does not know (e.g. `s3a://`) or found by name in a metastore (`delta.catalog`),
    which only runs that start Spark check."""
    delta, named = settings.delta_tables(), set(settings.delta_named())
    catalog = open_catalog(settings) if any(t not in delta and t not in named for t in tables) else None
    return {t: _latest_delta_version(delta[t]) if t in delta else None if t in named
            else cast(Catalog, catalog).load_table(t).metadata.current_snapshot_id for t in tables}


def _latest_delta_version(location: str) -> int | None:
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        fs, base = pafs.FileSystem.from_uri(location.rstrip("/") + "/_delta_log")
    except (pa.ArrowInvalid, ValueError):
        return None
    found = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    return max((int(f.base_name[:20]) for f in found if _DELTA_COMMIT.match(f.base_name)), default=None)


_DELTA_COMMIT = re.compile(r"^\d{20}\.json$")


def open_catalog(settings: Settings) -> Catalog:
    """A pyiceberg catalog on the catalog `settings` names. Cost: imports pyiceberg (about 0.7 s) and,
    for SQL and REST catalogs, opens a connection; no table is read."""
    props = settings.catalog.properties
    kind = props.get("type", "hadoop")
    try:
        if kind == "hadoop":
            warehouse = _hadoop_warehouse(props.get("warehouse", ""))
            existing = next(p for p in (warehouse, *warehouse.parents) if p.exists())
            if not existing.is_dir():  # Java would fail at the first write; say so before anything
                raise CatalogUnavailableError(f"catalog {settings.catalog.name} cannot be reached: the warehouse "
                                              f"{warehouse} cannot be created: {existing} is not a directory")
            return HadoopCatalog(settings.catalog.name, warehouse=warehouse, **settings.catalog.pyiceberg)
        if kind == "jdbc":
            from pyiceberg.catalog.sql import SqlCatalog  # imports SQLAlchemy: only for JDBC catalogs

            return SqlCatalog(settings.catalog.name, **{**_passed_on(props), "uri": sqlalchemy_uri(props),
                                                        **settings.catalog.pyiceberg})
        from pyiceberg.catalog import load_catalog

        extra = _s3_from_spark(settings.spark.conf) if kind == "rest" else {}
        return load_catalog(settings.catalog.name, **{"type": kind, "uri": props.get("uri", ""), **_passed_on(props),
                                                      **extra, **settings.catalog.pyiceberg})
    except (ConfigError, CatalogUnavailableError):
        raise
    except Exception as exc:  # connection refused, bad credentials, missing driver, ...
        raise CatalogUnavailableError(f"catalog {settings.catalog.name} cannot be reached: "
                                      f"{first_line(exc)}") from exc


def spark_catalog_properties(settings: Settings) -> dict[str, str]:
    """The catalog's properties as Spark's Iceberg catalog gets them (computed, nothing touched).

    On a JDBC catalog in SQLite, Iceberg's JdbcCatalog looks for its tables at start-up with a result
    set it never closes: the read lock that leaves on the file lasts as long as the session and makes
    every other writer (the ledger's commits through pyiceberg, another process) fail with "database
    is locked". So Spark is told not to look, and `create_catalog_tables` makes them instead."""
    props = dict(settings.catalog.properties)
    if _creates_tables_for_spark(props):
        props["jdbc.init-catalog-tables"] = "false"
    return props


def create_catalog_tables(settings: Settings) -> None:
    """Before a Spark session uses a SQLite JDBC catalog: its tables, through pyiceberg's SqlCatalog
    (which creates them when missing). Cost: opens the database; nothing for other catalogs."""
    if _creates_tables_for_spark(settings.catalog.properties):
        open_catalog(settings)


def _creates_tables_for_spark(props: dict[str, str]) -> bool:
    return props.get("type") == "jdbc" and props.get("uri", "").startswith("jdbc:sqlite:") \
        and "jdbc.init-catalog-tables" not in props



def _passed_on(props: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items() if k not in _JAVA_ONLY}


def sqlalchemy_uri(props: dict[str, str]) -> str:
    """The SQLAlchemy URL of an Iceberg JDBC catalog's database (`uri: jdbc:sqlite:/x` or
    `jdbc:postgresql://host:port/db` with `jdbc.user` / `jdbc.password`)."""
    uri = props.get("uri", "")
    if uri.startswith("jdbc:sqlite:"):
        path = uri[len("jdbc:sqlite:"):].split("?")[0]
        path = re.sub(r"^file:/*", "/", path)
        return f"sqlite:///{Path(path).resolve()}"
    if uri.startswith("jdbc:postgresql:"):
        parsed = urlparse(uri[len("jdbc:"):])
        user, password = props.get("jdbc.user", ""), props.get("jdbc.password", "")
        auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user else ""
        return f"postgresql+psycopg2://{auth}{parsed.netloc}{parsed.path}"
    raise ConfigError(f"catalog uri {uri.split(':')[0:2]} is not a JDBC URL for SQLite or PostgreSQL, which the "
                      "control plane can open; set catalog.pyiceberg.uri to its SQLAlchemy URL")


def _s3_from_spark(conf: dict[str, str]) -> dict[str, str]:
    """pyiceberg's S3 settings from Spark's S3A ones, so one dsr.yaml serves both planes."""
    s3a = "spark.hadoop.fs.s3a."
    out = {"s3.region": conf.get(f"{s3a}endpoint.region", "us-east-1")}  # never look the region up online
    for spark_key, ours in (("endpoint", "s3.endpoint"), ("access.key", "s3.access-key-id"),
                            ("secret.key", "s3.secret-access-key"), ("session.token", "s3.session-token")):
        if f"{s3a}{spark_key}" in conf:
            out[ours] = conf[f"{s3a}{spark_key}"]
    if conf.get(f"{s3a}path.style.access", "").lower() == "true":
        out["s3.force-virtual-addressing"] = "false"
    return out


def _hadoop_warehouse(warehouse: str) -> Path:
    if not warehouse:
        raise ConfigError("a hadoop catalog needs a warehouse")
    if warehouse.startswith("file:"):
        return Path(re.sub(r"^file:/*", "/", warehouse))
    if "://" not in warehouse:
        return Path(warehouse).resolve()
    raise ConfigError(f"the control plane commits to hadoop catalogs on a local file system only, not "
                      f"{warehouse.split('://')[0]}://; use a JDBC or REST catalog there")


class HadoopCatalog(MetastoreCatalog):
    """Iceberg's hadoop catalog layout on a local file system, readable and writable by pyiceberg."""

    def __init__(self, name: str, warehouse: Path, **properties: str):
        super().__init__(name, warehouse=Path(warehouse).as_uri(), **properties)
        self.root = Path(warehouse)

    # -- namespaces: folders -----------------------------------------------------------------
    def _folder(self, namespace) -> Path:
        return self.root.joinpath(*self.identifier_to_tuple(namespace))

    def create_namespace(self, namespace, properties=None) -> None:
        folder = self._folder(namespace)
        if folder.is_dir():
            raise NamespaceAlreadyExistsError(f"namespace {namespace} already exists")
        folder.mkdir(parents=True, exist_ok=True)

    def load_namespace_properties(self, namespace) -> dict[str, str]:
        folder = self._folder(namespace)
        if not folder.is_dir():
            raise NoSuchNamespaceError(f"namespace {namespace} does not exist")
        return {"location": folder.as_uri()}

    def list_namespaces(self, namespace=()) -> list[tuple[str, ...]]:
        base = self._folder(namespace) if namespace else self.root
        prefix = self.identifier_to_tuple(namespace) if namespace else ()
        return [(*prefix, p.name) for p in sorted(base.iterdir())
                if p.is_dir() and not (p / "metadata").is_dir()] if base.is_dir() else []

    def list_tables(self, namespace) -> list[tuple[str, ...]]:
        folder = self._folder(namespace)
        ns = self.identifier_to_tuple(namespace)
        return [(*ns, p.name) for p in sorted(folder.iterdir()) if (p / "metadata").is_dir()] \
            if folder.is_dir() else []

    def drop_namespace(self, namespace) -> None:
        self._folder(namespace).rmdir()

    def update_namespace_properties(self, namespace, removals=None, updates=None):
        raise NotImplementedError("hadoop catalogs keep no namespace properties")

    # -- tables: metadata/vN.metadata.json --------------------------------------------------------
    def _metadata_dir(self, identifier) -> Path:
        return self.root.joinpath(*self.identifier_to_tuple(identifier), "metadata")

    def _current_version(self, metadata: Path) -> tuple[int, Path] | None:
        """The newest version: the highest `vN` file of the folder. Not the version hint, as Java reads
        it: under concurrent commits a writer can replace the hint after later writers replaced it, and
        the versions just after that stale hint may already be deleted (old metadata files go), so
        walking forward from it stops at an old version, which a commit would then follow. Cost: one
        listing of the metadata folder."""
        found = [int(m.group(1)) for p in metadata.glob("v*.metadata.json") if (m := _VERSION.match(p.name))]
        if not found:
            return None
        version = max(found)
        file = self._version_file(metadata, version)
        return (version, file) if file else None

    @staticmethod
    def _version_file(metadata: Path, version: int) -> Path | None:
        for name in (f"v{version}.metadata.json", f"v{version}.gz.metadata.json"):
            if (metadata / name).is_file():
                return metadata / name
        return None

    def load_table(self, identifier):
        return self._load_version(identifier)[1]

    def _load_version(self, identifier) -> tuple[int, Table]:
        """The current version number and the table as that version's file describes it."""
        current = self._current_version(self._metadata_dir(identifier))
        if current is None:
            raise NoSuchTableError(f"table {'.'.join(self.identifier_to_tuple(identifier))} does not exist")
        location = current[1].as_uri()
        io = load_file_io(self.properties, location)
        metadata = FromInputFile.table_metadata(io.new_input(location))
        return current[0], Table(self.identifier_to_tuple(identifier), metadata, location, io, self)

    def create_table(self, identifier, schema, location=None, partition_spec=None, sort_order=None,
                     properties=None):
        folder = self.root.joinpath(*self.identifier_to_tuple(identifier))
        staged = self._create_staged_table(identifier, schema, folder.as_uri(), partition_spec or
                                           UNPARTITIONED_PARTITION_SPEC, sort_order or UNSORTED_SORT_ORDER,
                                           properties or {})
        self._publish(folder / "metadata", 1, staged.metadata, staged.io)
        return self.load_table(identifier)

    def commit_table(self, table, requirements, updates):
        metadata_dir = self._metadata_dir(table.name())
        # The requirements are checked against the very version the new one must follow.
        version, current_table = self._load_version(table.name())
        staged = self._update_and_stage_table(current_table, table.name(), requirements, updates)
        if staged.metadata == current_table.metadata:
            return CommitTableResponse(metadata=current_table.metadata,
                                       metadata_location=current_table.metadata_location)
        if not self._publish(metadata_dir, version + 1, staged.metadata, staged.io):
            raise CommitFailedException(f"{'.'.join(table.name())} was changed by another writer (version "
                                        f"{version + 1} exists)")
        return CommitTableResponse(metadata=staged.metadata,
                                   metadata_location=(metadata_dir / f"v{version + 1}.metadata.json").as_uri())

    def _publish(self, metadata_dir: Path, version: int, metadata, io) -> bool:
        """Write version `version`; False if another writer created it first (the atomic step is the link)."""
        metadata_dir.mkdir(parents=True, exist_ok=True)
        temp = metadata_dir / f"{uuid.uuid4()}.metadata.json"
        self._write_metadata(metadata, io, temp.as_uri())
        try:
            os.link(temp, metadata_dir / f"v{version}.metadata.json")
        except FileExistsError:
            return False
        finally:
            temp.unlink()
        hint = metadata_dir / f"{uuid.uuid4()}-version-hint.temp"
        hint.write_text(str(version))
        os.replace(hint, metadata_dir / "version-hint.text")
        return True

    def drop_table(self, identifier) -> None:
        shutil.rmtree(self.root.joinpath(*self.identifier_to_tuple(identifier)))

    def register_table(self, identifier, metadata_location, overwrite=False):
        raise NotImplementedError("hadoop catalogs find tables by their folder")

    def rename_table(self, from_identifier, to_identifier):
        raise NotImplementedError("hadoop catalogs cannot rename tables")

    def list_views(self, namespace) -> list:
        return []

    def view_exists(self, identifier) -> bool:
        return False

    def load_view(self, identifier):
        raise NotImplementedError("hadoop catalogs hold no views")

    def drop_view(self, identifier) -> None:
        raise NotImplementedError("hadoop catalogs hold no views")

    def register_view(self, identifier, metadata_location):
        raise NotImplementedError("hadoop catalogs hold no views")
