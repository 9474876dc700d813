"""The stages of a run: identity, access export, erase, collateral check, purge, verification."""
