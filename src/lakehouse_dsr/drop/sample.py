"""A DROP download built from the lake's own identifiers, to try a whole cycle before DROP sends one.

`sample_download` hashes the values of every list the data map's `drop:` section places, as the
matching does (drop/matching.py's `Placement.hashed`), picks some people's hashes, adds hashes of
values nobody in the lake has, and writes them as a download DROP could have sent: a ZIP of `ID,Hash`
files named `YYYYMMDD_BROKER_Type.csv`, owner-only. Only the hashes of the people picked reach the
driver, never a value; the file holds hashes, which are personal data too: keep it like a real one.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

from pyspark.sql import functions as F

from ..config import Settings
from ..exceptions import DsrError
from ..keys import write_private
from ..lake.frames import to_arrow
from ..lake.lakehouse import Lake
from .hashing import Rules
from .lists import DROP_NAMES
from .matching import NO_HASH, placements


@dataclass(frozen=True)
class SampleDownload:
    """What `sample_download` wrote: the ZIP, and per list the work items of people of the lake and
    of nobody."""

    path: Path
    people: dict[str, int] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)


def sample_download(lake: Lake, settings: Settings, out: Path, people: int = 20, unknown: int = 5,
                    day: date | None = None, broker_id: str = "0000", seed: int = 42) -> SampleDownload:
    """Write to `out` a download of every list `drop:` places: per list `people` hashes of values of
    the lake's people (chosen by a hash of their subject and `seed`, so the same lake gives the same
    sample) and `unknown` hashes of values nobody has. Work-item IDs are 12 letters and digits.
    Cost: per list, one Spark job that reads and hashes the list's columns (as a match does) and
    brings back `people` hashes."""
    if not settings.datamap.drop:
        raise DsrError("the data map has no drop: section: no DROP list is placed in the lake")
    if not (len(broker_id) == 4 and broker_id.isdigit()):
        raise DsrError(f"broker id {broker_id!r}: DROP's are four digits")
    day = day or datetime.now(UTC).date()
    rules = Rules(zip_plus4=settings.drop.zip_plus4)
    files: dict[str, list[str]] = {}
    result = SampleDownload(out)
    for list_name in settings.datamap.drop:
        place = next((p for p in placements(settings.datamap, {list_name})), None)
        if place is None:
            continue
        subject = F.col(place.subject_column).cast("string")
        hashed = place.hashed(lake.spark.table(lake.quoted(place.table)), rules,
                              F.xxhash64(subject, F.lit(seed)).alias("order"))
        chosen = hashed.where(~F.col("hash").startswith(NO_HASH)).dropDuplicates(["hash"]).orderBy("order").limit(
            people)
        found = [str(h) for h in to_arrow(chosen.select("hash")).column("hash").to_pylist()]
        nobody = [_digest(f"{list_name}-nobody-{seed}-{i}") for i in range(unknown)]
        code = DROP_NAMES[list_name].upper()[:4]
        files[DROP_NAMES[list_name]] = [f"{code}{i:0{12 - len(code)}d},{h}" for i, h in enumerate([*found, *nobody])]
        result.people[list_name], result.unknown[list_name] = len(found), len(nobody)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for kind, rows in files.items():
            zf.writestr(f"{day:%Y%m%d}_{broker_id}_{kind}.csv", "ID,Hash\n" + "".join(f"{r}\n" for r in rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_private(out, archive.getvalue())
    return result


def _digest(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
