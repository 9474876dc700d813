"""The published JSON Schemas: the evidence documents (evidence/models.py), the signed certificate,
the documents exchanged with other privacy tools (evidence/handoff.py), and `dsr.yaml` itself (for
editors: `# yaml-language-server: $schema=schemas/dsr.schema.json`).

`dsr schema` writes them; the repository keeps a copy in schemas/ that a test holds equal to what
the code generates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import Settings
from . import handoff, models

BASE_URI = "https://github.com/lakehouse-dsr/lakehouse-dsr/schemas/"


def schemas() -> dict[str, dict]:
    """Every published schema by file stem (`<stem>.schema.json`), each with its `$schema` and `$id`."""
    from . import certificate

    found = {**models.json_schemas(), **handoff.json_schemas(),
             "dsr": _with_placeholders(Settings.model_json_schema()),
             "certificate": certificate.Certificate.model_json_schema()}
    return {stem: {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"{BASE_URI}{stem}.schema.json",
                   **schema} for stem, schema in found.items()}


# A whole value `${NAME}` or `${NAME:-default}`: dsr.yaml may take any value from the environment
# (config.expand_env), so a number, a flag or a choice may be written as one.
PLACEHOLDER = {"type": "string", "pattern": r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}$"}


def _with_placeholders(node: Any) -> Any:
    """`node` (a JSON Schema) where every number, integer, boolean and enumerated value also admits
    an environment placeholder."""
    if isinstance(node, list):
        return [_with_placeholders(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _with_placeholders(v) for k, v in node.items()}
    if out.get("type") in ("number", "integer", "boolean") or "enum" in out or "const" in out:
        return {"anyOf": [out, PLACEHOLDER]}
    return out


def write_schemas(directory: str | Path) -> list[Path]:
    """Write every schema into `directory` (created if missing); returns the files written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, schema in sorted(schemas().items()):
        path = out / f"{stem}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
