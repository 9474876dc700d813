"""Every error the engine raises on purpose derives from DsrError; the CLI turns them into a message and exit code 2."""


def first_line(exc: BaseException, with_type: bool = False) -> str:
    """The first line of an exception's message (its type when it has none), short enough for a
    report or a one-line error; `with_type` prefixes the exception's type."""
    text = str(exc).strip()
    line = text.splitlines()[0][:300] if text else type(exc).__name__
    return f"{type(exc).__name__}: {line}" if with_type else line


class DsrError(Exception):
    """Base class: a problem the user can fix, described in plain words."""


class ConfigError(DsrError):
    """dsr.yaml is missing, malformed or invalid."""


class DataMapError(ConfigError):
    """The data map names a table or column that does not exist, or is inconsistent."""


class EnvironmentSetupError(DsrError):
    """Java or the Iceberg runtime jar cannot be found."""


class RequestInputError(DsrError):
    """A submitted request (command line or CSV) is malformed."""


class LedgerError(DsrError):
    """A ledger operation refers to an unknown request or an invalid transition."""


class CommitConflictError(DsrError):
    """Concurrent writers kept invalidating a commit; the bounded retries are exhausted."""


class CatalogUnavailableError(DsrError):
    """The catalog (or its storage) cannot be reached."""


class LedgerBusyError(DsrError):
    """Another run holds the ledger's lease (the CLI exits 3)."""
