"""The data map: which tables hold personal data, by which key, and what erasure means there.

```yaml
datamap:
  subject: user_id                 # the primary identifier requests are filed under
  identifiers:                     # other identifiers, found through a table
    email: {table: demo.users, subject_column: user_id, column: email}
  tables:
    demo.events:     {key: user_id, identifier: user_id}              # action: delete
    demo.newsletter: {key: email, identifier: email}
    demo.orders:     {key: user_id, identifier: user_id, action: redact,
                      redact: [user_id, customer_name, shipping_address]}
```
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" would let a trailing newline through


def _check_table(name: str) -> str:
    if not _TABLE.match(name):
        raise ValueError(f"table {name!r} must be written namespace.table (letters, digits, _)")
    return name


def _check_column(name: str) -> str:
    if not _COLUMN.match(name):
        raise ValueError(f"column {name!r} must be a plain identifier (letters, digits, _)")
    return name


class LinkedIdentifier(BaseModel):
    """An identifier other than the subject id, read from `table` where `subject_column` is the subject."""

    model_config = ConfigDict(extra="forbid")
    table: str
    subject_column: str
    column: str

    @model_validator(mode="after")
    def _names(self) -> LinkedIdentifier:
        _check_table(self.table)
        _check_column(self.subject_column)
        _check_column(self.column)
        return self


class TableMapping(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    identifier: str | None = None  # defaults to the data map's subject identifier
    action: Literal["delete", "redact"] = "delete"
    redact: list[str] = Field(default_factory=list)
    # Told to the subject with an access export (GDPR Art. 15(1)); optional.
    purpose: str | None = None
    recipients: list[str] = Field(default_factory=list)
    retention: str | None = None

    def disclosure(self) -> dict:
        return {"purpose": self.purpose, "recipients": self.recipients, "retention": self.retention}

    @model_validator(mode="after")
    def _consistent(self) -> TableMapping:
        _check_column(self.key)
        for column in self.redact:
            _check_column(column)
        if self.action == "redact":
            if not self.redact:
                raise ValueError("action 'redact' needs the list of columns to set to NULL")
            if self.key not in self.redact:
                # Otherwise the kept row would still point to the subject.
                raise ValueError(f"redacted columns must include the key column {self.key!r}")
        elif self.redact:
            raise ValueError("'redact' columns are only meaningful with action: redact")
        return self


class DataMap(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subject: str = "user_id"
    identifiers: dict[str, LinkedIdentifier] = Field(default_factory=dict)
    tables: dict[str, TableMapping]

    @model_validator(mode="after")
    def _consistent(self) -> DataMap:
        if not self.tables:
            raise ValueError("the data map lists no tables")
        if self.subject in self.identifiers:
            raise ValueError(f"{self.subject!r} is the subject identifier; it cannot also be linked")
        for name, mapping in self.tables.items():
            _check_table(name)
            if mapping.identifier is None:
                mapping.identifier = self.subject
            if mapping.identifier != self.subject and mapping.identifier not in self.identifiers:
                raise ValueError(
                    f"table {name}: identifier {mapping.identifier!r} is neither the subject "
                    f"({self.subject!r}) nor one of the linked identifiers {sorted(self.identifiers)}"
                )
        return self

    def identifier_types(self) -> list[str]:
        return [self.subject, *self.identifiers]

    def erase_order(self) -> list[str]:
        """Tables that identifiers are resolved through come last, so a resumed run can still resolve."""
        sources = {link.table for link in self.identifiers.values()}
        return sorted(self.tables, key=lambda t: (t in sources, t))


def demo_datamap() -> DataMap:
    return DataMap.model_validate(
        {
            "subject": "user_id",
            "identifiers": {"email": {"table": "demo.users", "subject_column": "user_id", "column": "email"}},
            "tables": {
                "demo.users": {"key": "user_id", "purpose": "customer account", "recipients": ["support team"],
                               "retention": "while the account exists"},
                "demo.events": {"key": "user_id", "purpose": "product analytics", "recipients": ["analytics team"],
                                "retention": "25 months"},
                "demo.newsletter": {"key": "email", "identifier": "email", "purpose": "newsletter (consent)",
                                    "recipients": ["email service provider"], "retention": "until unsubscribed"},
                "demo.orders": {
                    "key": "user_id",
                    "action": "redact",
                    "redact": ["user_id", "customer_name", "shipping_address"],
                    "purpose": "order fulfilment; amounts kept for tax law",
                    "recipients": ["payment processor", "tax authority"],
                    "retention": "10 years (amounts), personal fields until erasure",
                },
            },
        }
    )
