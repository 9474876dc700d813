"""Named failpoints for crash tests: `DSR_FAIL_AT=<name>` kills the process there, as SIGKILL would.

Nothing is flushed or cleaned up: the point is to prove that the ledger, the step journal and
Iceberg's atomic commits let the next `dsr run` finish what the killed one started.
"""

from __future__ import annotations

import os
import signal

from .exceptions import ConfigError

ENV = "DSR_FAIL_AT"
FAILPOINTS = (
    "after_start",    # requests marked in progress, nothing erased yet
    "during_export",  # on an executor, after the first access package is written
    "before_propagate",  # mapped tables erased and journaled, derived tables untouched
    "during_propagate",  # the first level of derived tables committed, not yet journaled
    "before_shred",   # keyed tables erased, the vault untouched
    "during_shred",   # the subjects' vault entries deleted and journaled, the vault's history not purged
    "after_shred",    # the vault purged, nothing verified
    "after_erase",    # every table's erase committed, nothing purged
    "after_purge",    # tables purged, not verified
    "after_verify",   # verified, outcomes not yet recorded
    "after_finish",   # outcomes recorded, the ledger's own history not yet purged
    "after_intake_ledger_commit",  # `dsr serve`: acknowledged requests in the ledger, the queue not yet told
)


def armed() -> str | None:
    """The failpoint named in the environment, checked against the known names."""
    name = os.environ.get(ENV) or None
    if name is not None and name not in FAILPOINTS:
        raise ConfigError(f"{ENV}={name!r} is not a failpoint (expected one of {', '.join(FAILPOINTS)})")
    return name


def failpoint(name: str) -> None:
    """Die here, at once, when `name` is armed."""
    if armed() == name:
        kill(os.getpid())


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
