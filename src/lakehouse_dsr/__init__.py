"""lakehouse-dsr: data subject requests (erasure, access) over an Apache Iceberg lakehouse."""

from .suppress import suppress

__all__ = ["suppress"]
