"""lakehouse-dsr: data subject requests (erasure, access) over an Apache Iceberg lakehouse."""

__all__ = ["suppress", "suppress_for"]


def __getattr__(name: str):
    # Lazily: `suppress` needs PySpark, which the control plane (dsr status, submit) never imports.
    if name in ("suppress", "suppress_for"):
        from .ingest import suppress

        return getattr(suppress, name)
    raise AttributeError(f"module 'lakehouse_dsr' has no attribute {name!r}")
