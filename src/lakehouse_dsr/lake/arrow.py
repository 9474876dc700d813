"""Arrow tables between pyiceberg and the rest (no PySpark here: the control plane uses it too)."""

from __future__ import annotations

import pyarrow as pa

_PLAIN: dict[pa.DataType, pa.DataType] = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}


def plain_offsets(table: pa.Table) -> pa.Table:
    """`table` with large strings and binaries (pyiceberg reads strings as large ones) as plain ones:
    Spark's Arrow reader takes 32-bit offsets (it reads large ones as empty values), and Arrow's joins
    want one type on both sides."""
    return table.cast(pa.schema([f.with_type(_PLAIN.get(f.type, f.type)) for f in table.schema]))
