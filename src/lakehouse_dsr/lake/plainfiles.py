"""Plain-file datasets (the data map's `files:`): reading them, and replacing one file by another
through Hadoop's FileSystem API, so local folders, HDFS and object stores (s3a) behave alike.

A rewritten file is published under a new name that records its predecessor
(`dsr-<id>-<old name>`) before the old one is deleted, so a crash leaves the old file, or the new
one, or both, never neither; `recover` finishes what a crash interrupted (both present: the old
one goes; a hidden temporary folder: removed).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, DataFrameReader, SparkSession

from ..datamap import FileMapping
from ..datamap.model import FILE_FORMATS, FileFormat, check_table_name
from ..exceptions import DataMapError, first_line
from .bridge import jclass
from .indriver import local_rows
from .lakehouse import Lake

_PUBLISHED = re.compile(r"^dsr-[0-9a-f]{8}-(.+)$")
_TEMP_PREFIX = ".dsr-tmp-"  # hidden: Spark's readers skip names starting with "." or "_"


def _fs(spark: SparkSession, path: str):
    jvm: Any = spark.sparkContext._jvm  # py4j's view of the driver JVM: untyped, set on every started session
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hadoop_path


def reader(spark: SparkSession, mapping: FileMapping) -> DataFrameReader:
    return spark.read.format(mapping.format).options(**mapping.spark_options())


def read_dataset(spark: SparkSession, mapping: FileMapping) -> DataFrame:
    """Every file under the dataset's folder (sub-folders included, hidden names skipped)."""
    return reader(spark, mapping).option("recursiveFileLookup", "true").load(mapping.path)


def _listed(fs, root) -> list:
    """Every file under `root` (Hadoop Paths), recursively, hidden ones included; none if it is missing."""
    if not fs.exists(root):
        return []
    found, listing = [], fs.listFiles(root, True)
    while listing.hasNext():
        found.append(listing.next().getPath())
    return found


def _relative_parts(root, file) -> list[str]:
    return [p for p in file.toUri().getPath()[len(root.toUri().getPath()):].split("/") if p]


def _visible(fs, root) -> list:
    """`_listed` without hidden `.`/`_` names, as Spark's readers skip them."""
    return [f for f in _listed(fs, root) if not any(p.startswith((".", "_")) for p in _relative_parts(root, f))]


def data_files(spark: SparkSession, path: str) -> list[str]:
    """Every visible file under `path`, recursively."""
    return sorted(f.toString() for f in _visible(*_fs(spark, path)))


def listing(path: str) -> frozenset[str] | None:
    """The visible files under `path` by their paths under it, listed through pyarrow (no JVM); None
    where pyarrow does not know the scheme (e.g. `s3a://`). Cost: one recursive listing."""
    try:
        fs, base = pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, ValueError):
        return None
    prefix = base.rstrip("/") + "/"
    found = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    names = (f.path.removeprefix(prefix) for f in found if f.type == pafs.FileType.File)
    return frozenset(n for n in names if not any(part.startswith((".", "_")) for part in n.split("/")))


def check_dataset(spark: SparkSession, name: str, mapping: FileMapping) -> DataFrame:
    """The dataset, read, or DataMapError saying why it cannot be (missing folder, no files, unreadable)."""
    if not data_files(spark, mapping.path):
        fs, root = _fs(spark, mapping.path)
        what = "holds no files" if fs.exists(root) else "does not exist"
        raise DataMapError(f"files {name}: path {mapping.path} {what}")
    try:
        frame = read_dataset(spark, mapping)
        frame.schema  # noqa: B018 - resolves the files (and, for json/csv, reads them for the schema)
        return frame
    except Exception as exc:
        raise DataMapError(f"files {name}: {mapping.format} files under {mapping.path} cannot be read: "
                           f"{first_line(exc)}") from None


def replace(spark: SparkSession, old: str, rows: DataFrame, mapping: FileMapping) -> str:
    """Write `rows` as one file of the dataset's format beside `old`, publish it, then delete `old`.
    Returns the new file's path. Cost: one write of `rows`; renames and deletes are metadata."""
    fs, old_path = _fs(spark, old)
    parent = old_path.getParent()
    temp = f"{parent.toString()}/{_TEMP_PREFIX}{uuid.uuid4().hex[:12]}"
    rows.coalesce(1).write.format(mapping.format).options(**mapping.spark_options()).mode("errorifexists").save(temp)
    _, temp_path = _fs(spark, temp)
    parts = [s.getPath() for s in fs.listStatus(temp_path) if not s.getPath().getName().startswith(("_", "."))]
    name = f"dsr-{uuid.uuid4().hex[:8]}-{old_path.getName()}"
    extension = "." + mapping.format
    if not name.endswith(extension):  # the reader picks decompression by extension: the new file is plain
        name += extension
    jvm: Any = spark.sparkContext._jvm
    new_path = jvm.org.apache.hadoop.fs.Path(parent, name)
    if len(parts) != 1 or not fs.rename(parts[0], new_path):
        fs.delete(temp_path, True)
        raise OSError(f"could not publish the rewrite of {old}")
    fs.delete(old_path, False)
    fs.delete(temp_path, True)
    return new_path.toString()


def recover(spark: SparkSession, path: str) -> int:
    """Finish replacements a crash interrupted under `path`; returns how many old files it removed."""
    fs, root = _fs(spark, path)
    jvm: Any = spark.sparkContext._jvm
    removed = 0
    for file in _listed(fs, root):
        if any(p.startswith(_TEMP_PREFIX) for p in _relative_parts(root, file)):
            fs.delete(file.getParent(), True)
            continue
        match = _PUBLISHED.match(file.getName())
        if not match:
            continue
        for old_name in (match.group(1), match.group(1).rsplit(".", 1)[0]):
            old = jvm.org.apache.hadoop.fs.Path(file.getParent(), old_name)
            if old_name != file.getName() and fs.exists(old):
                fs.delete(old, False)
                removed += 1
                break
    return removed


@dataclass
class Adopted:
    table: str
    format: str
    files: int
    rows: int
    copied: bool  # False: the table references the original files where they are


def adopt(lake: Lake, path: str, table: str, fmt: str = "parquet") -> Adopted:
    """Bring a plain dataset under a table format as `table` (which must not exist), so it gets the
    full cycle.

    Parquet: an empty Iceberg table with the files' schema, then Iceberg's `add_files` registers the
    files where they are: nothing is copied, and from then on the table owns them (a purge deletes a
    rewritten one at its original path). `delta`: the Parquet folder converted in place into a Delta
    table (`CONVERT TO DELTA`: a log written beside the files, which stay where they are; map it with
    `format: delta` and `path:` the folder). JSON/CSV, which neither format can reference: the rows
    are copied into an Iceberg table (one read and one write of the dataset); the original files stay
    as they are.
    """
    if fmt not in (*FILE_FORMATS, "delta"):
        raise DataMapError(f"unknown format {fmt!r} (expected one of {', '.join((*FILE_FORMATS, 'delta'))})")
    if any(c in path for c in "`'\n"):
        raise DataMapError("the path must not contain quotes, backticks or line breaks")
    try:
        check_table_name(table)
    except ValueError as exc:
        raise DataMapError(str(exc)) from None
    spark, handle = lake.spark, lake.iceberg(table)
    name = handle.quoted
    if fmt != "delta" and spark.catalog.tableExists(name):
        raise DataMapError(f"table {table} exists already; adopt into a new table")
    file_format = cast(FileFormat, "parquet" if fmt == "delta" else fmt)  # a format, checked above
    frame = check_dataset(spark, path, FileMapping(path=path, format=file_format, key="unused"))  # errors name the path
    fs, root = _fs(spark, path)
    files = _visible(fs, root)
    if fmt == "delta":
        if fs.exists(jclass(spark, "org.apache.hadoop.fs.Path")(f"{path.rstrip('/')}/_delta_log")):
            raise DataMapError(f"{path} is a Delta table already: map it with format: delta and path: {path}")
        if any(len(_relative_parts(root, f)) > 1 for f in files):
            raise DataMapError(f"{path} holds sub-folders: CONVERT TO DELTA needs the partition columns of a "
                               "partitioned folder; convert it with Delta's own command, then map it")
        spark.sql(f"CONVERT TO DELTA parquet.`{path}`")
        return Adopted(table, fmt, len(files), spark.read.format("delta").load(path).count(), False)
    if fmt == "parquet":
        if any(len(_relative_parts(root, f)) > 1 for f in files):
            raise DataMapError(f"{path} holds sub-folders: add_files registers the files of one folder; adopt each "
                               "folder, or map the dataset under files:")
        local_rows(spark, [], frame.schema).writeTo(name).tableProperty("format-version", "2").create()
        spark.sql(f"CALL `{lake.catalog_name}`.system.add_files(table => '{handle.procedure_name}', "
                  f"source_table => '`parquet`.`{path}`')").collect()
    else:
        frame.writeTo(name).tableProperty("format-version", "2").create()
    return Adopted(table, fmt, len(files), spark.table(name).count(), fmt != "parquet")
