"""The published JSON Schemas (schemas/): equal to what the code generates, and real documents
validate against them with an independent validator (jsonschema), while documents that drift fail."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from helpers import SEED
from lakehouse_dsr import synth
from lakehouse_dsr.evidence.schemas import schemas, write_schemas
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

ROOT = Path(__file__).parent.parent


def validator(stem: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / "schemas" / f"{stem}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_published_schemas_are_what_the_code_generates(tmp_path):
    written = write_schemas(tmp_path)
    assert {p.name for p in written} == {p.name for p in (ROOT / "schemas").glob("*.schema.json")}, \
        "run `dsr schema` and commit schemas/"
    for path in written:
        assert path.read_text() == (ROOT / "schemas" / path.name).read_text(), f"{path.name} is stale: run `dsr schema`"
    assert {"dsr", "run-report", "erasure-evidence", "access-evidence"} <= set(schemas())


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_the_example_configs_validate_against_the_dsr_yaml_schema(example):
    raw = yaml.safe_load((ROOT / "examples" / example).read_text())
    validator("dsr").validate(raw)


def test_the_demo_data_map_validates_against_the_dsr_yaml_schema():
    raw = yaml.safe_load((ROOT / "src" / "lakehouse_dsr" / "demo" / "datamap.yaml").read_text())
    validator("dsr").validate({"datamap": raw})
    with pytest.raises(jsonschema.ValidationError, match="tabels"):
        validator("dsr").validate({"datamap": {**raw, "tabels": {}}})


def test_a_config_with_a_misspelt_section_or_a_wrong_type_fails_the_schema():
    check = validator("dsr")
    raw = yaml.safe_load((ROOT / "examples" / "dsr.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError, match="purgee"):
        check.validate({**raw, "purgee": {"policy": "batched"}})
    with pytest.raises(jsonschema.ValidationError):
        check.validate({**raw, "run": {"parallel_tables": "many"}})


def test_a_real_run_report_and_the_requests_evidence_validate(spark, new_lakehouse):
    settings = new_lakehouse()
    ledger = Ledger(settings)
    ledger.submit([RequestInput(synth.user_id(SEED, 1), "erase"), RequestInput(synth.user_id(SEED, 2), "access")])
    report = run(spark, settings)
    assert {r.status for r in report.requests} == {"completed"}
    document = json.loads(json.dumps(report.as_dict()))
    validator("run-report").validate(document)
    assert document["version"] == 1 and document["tables"]["demo.events"]["verification"]["passed"]

    evidence = ledger.evidence([r.request_id for r in report.requests])
    kinds = {rid: "erasure-evidence" if "tables" in e else "access-evidence" for rid, e in evidence.items()}
    assert sorted(kinds.values()) == ["access-evidence", "erasure-evidence"]
    for rid, e in evidence.items():
        validator(kinds[rid]).validate(json.loads(json.dumps(e)))

    drifted = {**document, "tables": {"demo.events": {**document["tables"]["demo.events"], "surprise": 1}}}
    with pytest.raises(jsonschema.ValidationError, match="surprise"):
        validator("run-report").validate(drifted)
