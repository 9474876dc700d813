"""Every error the engine raises on purpose derives from DsrError; the CLI turns them into a message and exit code 2."""

import errno


def first_line(exc: BaseException, with_type: bool = False) -> str:
    """The first line of an exception's message (its type when it has none), short enough for a
    report or a one-line error; `with_type` prefixes the exception's type. A full disk is said so,
    whatever the first line (a Py4J error's names only the Java call that failed)."""
    text = str(exc).strip()
    line = "the disk is full (No space left on device)" if disk_full(exc) else \
        text.splitlines()[0][:300] if text else type(exc).__name__
    return f"{type(exc).__name__}: {line}" if with_type else line


def disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it arose from, says a disk is full: an OSError with ENOSPC, or
    the text Java's and Python's I/O give it (a Py4J error carries the Java side's trace as text)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC or "No space left on device" in str(current):
            return True
        # Only Python exceptions are followed (a Py4J error's Java exception, given here too, has no such links)
        current = next((e for e in (getattr(current, "__cause__", None), getattr(current, "__context__", None))
                        if isinstance(e, BaseException)), None)
    return False


class DsrError(Exception):
    """Base class: a problem the user can fix, described in plain words."""


class ConfigError(DsrError):
    """dsr.yaml is missing, malformed or invalid."""


class DataMapError(ConfigError):
    """The data map names a table or column that does not exist, or is inconsistent."""


class EnvironmentSetupError(DsrError):
    """Java or the Iceberg runtime jar cannot be found."""


class SparkConnectError(EnvironmentSetupError):
    """A Spark Connect session was given where the engine works in the driver's JVM (the data plane)."""


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
