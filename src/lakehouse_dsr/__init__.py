"""lakehouse-dsr: data subject requests (erasure, access) over an Apache Iceberg lakehouse."""

__all__ = ["erased", "pseudonymize", "reidentify", "suppress", "suppress_for", "suppress_stream"]


def __getattr__(name: str):
    # Lazily: `suppress` needs PySpark, which the control plane (dsr status, submit) never imports.
    if name in ("erased", "suppress", "suppress_for"):
        from .ingest import suppress

        return getattr(suppress, name)
    if name in ("pseudonymize", "reidentify"):
        from .vault import pseudonymize

        return getattr(pseudonymize, name)
    if name == "suppress_stream":
        from .ingest import stream

        return stream.suppress_stream
    raise AttributeError(f"module 'lakehouse_dsr' has no attribute {name!r}")
