"""`dsr run`: every open request in one batch per type.

Access requests first (a person asking for a copy and erasure gets the copy): resolve -> export
-> checksum check (exports.py). Then erase requests as one batch (erasure.py): resolve -> erase
-> propagate -> purge -> prove (proof.py). Then opt-out and opt-in requests and the data map's
shares (stages/share.py): consent recorded, every share refreshed without opted-out or erased
subjects, purged and verified. Then one ledger commit for all outcomes and the ledger's own purge
(orchestrator.py). A request completes only when its proof holds (package checksum, or every
table's and share's verification); otherwise it stays open (status failed, retried by the next
run) with the reasons: the rules are pure functions (rules.py).

Modules: `context` (what the stages share, timing), `work` (what the ledger holds for a run),
`rules` (outcomes), `exports`, `erasure`, `proof`, `orchestrator` (`run`).
"""

from .orchestrator import run

__all__ = ["run"]
