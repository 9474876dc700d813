"""lakehouse-dsr: data subject requests (erasure, access) over an Apache Iceberg lakehouse."""

__all__ = ["suppress"]


def __getattr__(name: str):
    # Lazily: `suppress` needs PySpark, which the control plane (dsr status, submit) never imports.
    if name == "suppress":
        from .ingest.suppress import suppress

        return suppress
    raise AttributeError(f"module 'lakehouse_dsr' has no attribute {name!r}")
