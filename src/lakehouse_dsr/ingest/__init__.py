"""Keeping erased people out of incoming data."""
