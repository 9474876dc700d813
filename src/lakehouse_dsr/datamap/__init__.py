"""The data map: which tables hold personal data, by which key, and what erasure means there."""

from .model import (
    DataMap,
    FileMapping,
    KeyGroup,
    LinkedIdentifier,
    SubjectClock,
    TableMapping,
    TopicMapping,
    column_path,
    column_ref,
    demo_datamap,
    is_array,
    sql_literal,
)

__all__ = ["DataMap", "FileMapping", "KeyGroup", "LinkedIdentifier", "SubjectClock", "TableMapping", "TopicMapping",
           "column_path", "column_ref", "demo_datamap", "is_array", "sql_literal"]
