"""lakehouse-dsr: data subject requests (erasure, access) over an Apache Iceberg lakehouse."""

from .ingest.suppress import suppress

__all__ = ["suppress"]
