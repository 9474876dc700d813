"""The data map: which tables hold personal data, by which key, and what erasure means there."""

from .model import DataMap, LinkedIdentifier, TableMapping, demo_datamap

__all__ = ["DataMap", "LinkedIdentifier", "TableMapping", "demo_datamap"]
