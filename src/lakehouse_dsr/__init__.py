"""lakehouse-dsr: data subject requests (erasure, access) over a lakehouse of Apache Iceberg and Delta
Lake tables.

The public API, for a notebook or a Spark job (every `dsr` command is one of these calls):

- settings: `load_settings`, `settings_from_dict`, `Settings`
- the ledger of requests (no SparkSession needed): `Ledger`, `RequestInput`, `RequestBatch` (requests
  as columns, for batches of any size: `RequestBatch.of`, or `read_requests_csv` of a CSV file)
- a run, on your SparkSession: `attach` (registers the catalog), `run` (returns a `RunReport`)
- proof: `verify_completed`
- the lake as the engine sees it, on your SparkSession: `Lake` (a catalog and the Delta tables on a
  session); `lake.table(name)` is an `IcebergTable` or a `DeltaTable` (versions, history, reads at a
  version; Iceberg's refs), both implementing `TableHandle`
- keeping erased people out of new data: `erased`, `suppress`, `suppress_for`, `suppress_stream`
- pseudonymization: `pseudonymize`, `reidentify`
- California DROP: `import_download`, `drop_status` (no SparkSession needed), `list_hash` (a DROP list's
  hash of a record's fields, as a Spark column)
- errors: `DsrError` and its subclasses in `lakehouse_dsr.exceptions`
"""

from __future__ import annotations

import importlib

# name -> the module defining it, imported on first use: the control plane (dsr status, submit) never
# imports PySpark. No export shares a submodule's name: importing that submodule would replace it.
_EXPORTS = {
    "load_settings": ".config", "settings_from_dict": ".config", "Settings": ".config",
    "Ledger": ".ledger.ledger", "RequestInput": ".ledger.requests", "RequestBatch": ".ledger.requests",
    "read_requests_csv": ".ledger.requests",
    "attach": ".lake.spark", "run": ".runner", "RunReport": ".evidence.report",
    "verify_completed": ".stages.verify",
    "Lake": ".lake.lakehouse", "IcebergTable": ".lake.iceberg", "DeltaTable": ".lake.delta",
    "TableHandle": ".lake.table",
    "erased": ".ingest.suppress", "suppress": ".ingest.suppress", "suppress_for": ".ingest.suppress",
    "suppress_stream": ".ingest.stream",
    "pseudonymize": ".vault.pseudonymize", "reidentify": ".vault.pseudonymize",
    "import_download": ".drop.items", "drop_status": ".drop.items", "list_hash": ".drop.hashing",
    "DsrError": ".exceptions",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lakehouse_dsr' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
