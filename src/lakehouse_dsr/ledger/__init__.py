"""The request ledger: requests, keys, audit, the step journal."""
