"""Pseudonymization and what is left of a person once the link is gone: re-identification risk."""
