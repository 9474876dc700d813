import tomllib
from importlib import resources
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from lakehouse_dsr.config import load_settings, settings_from_dict
from lakehouse_dsr.datamap import DataMap, demo_datamap
from lakehouse_dsr.exceptions import ConfigError, DataMapError
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.runner import run

ROOT = Path(__file__).parent.parent


def test_without_a_dsr_yaml_the_demo_configuration_applies(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_settings()
    assert s.datamap == demo_datamap()  # the demo's own file, demo/datamap.yaml
    assert s.catalog.name == "lakehouse"
    assert s.catalog.properties == {"type": "hadoop", "warehouse": (tmp_path / "lakehouse").as_uri()}
    assert s.spark.master == "local[*]"
    assert set(s.datamap.tables) == {"demo.users", "demo.events", "demo.newsletter", "demo.orders",
                                     "demo_vault.events"}
    assert set(s.datamap.shredded) == {"demo_vault.events"}  # the pseudonymized copy of the events
    assert s.key_file() == tmp_path / "dsr-secret.key"


def test_the_demo_data_map_is_the_packaged_file():
    """One source of truth: demo_datamap() is demo/datamap.yaml (the package ships it), and its variants
    only leave layers out or add the expiry `dsr demo` enforces."""
    raw = yaml.safe_load((resources.files("lakehouse_dsr") / "demo" / "datamap.yaml").read_text())
    assert DataMap.model_validate(raw) == demo_datamap()
    assert list(demo_datamap().tables) == list(raw["tables"]) and list(demo_datamap().derived) == list(raw["derived"])
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "demo/datamap.yaml" in package_data["lakehouse_dsr"]
    bronze = demo_datamap(derived=False)
    assert not bronze.derived and not bronze.shredded and set(bronze.tables) == set(raw["tables"]) - {
        "demo_vault.events"}
    assert set(demo_datamap(derived=False, vault=True).shredded) == {"demo_vault.events"}
    expiring = demo_datamap(expire=True)  # `dsr demo`: the events' 25 months, and the daily silver's
    assert [(t, r.after) for t, m in {**expiring.tables, **expiring.derived}.items() for r in m.expire] == [
        ("demo.events", "25 months"), ("demo_silver.user_daily", "25 months")]


def test_a_config_without_a_datamap_is_refused_where_the_map_is_used(tmp_path):
    """Never the demo's tables by default: a config of one's own without `datamap:` loads (the ledger and the
    service need no map), and every use of the map, a run first, refuses it with the section's name."""
    message = r"mine\.yaml has no datamap: section: name the tables that hold personal data there"
    raw = {"catalog": {"properties": {"type": "hadoop", "warehouse": "wh"}}, "secret_key_file": "k"}
    for section in ({}, {"datamap": None}):  # absent, or `datamap:` with nothing under it
        settings = settings_from_dict({**raw, **section}, base=tmp_path, source="mine.yaml")
        assert settings.key_file() == tmp_path / "k" and settings.datamap_ is None
        with pytest.raises(ConfigError, match=message):
            settings.datamap  # noqa: B018
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message):
        load_settings(tmp_path / "mine.yaml").datamap  # noqa: B018
    with pytest.raises(ConfigError, match=message):
        run(lambda: pytest.fail("no session: refused first"), settings)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]  # no ledger, no key: nothing changed
    mapped = settings.replace(datamap=demo_datamap(derived=False))  # a map given later, as a copy
    assert mapped.datamap == demo_datamap(derived=False) and settings.datamap_ is None
    assert settings.model_copy(update={"datamap": demo_datamap()}).datamap == demo_datamap()
    assert "datamap" in mapped.model_dump() and "datamap" not in settings.model_dump(exclude_none=True)


def test_yaml_sets_spark_catalog_and_datamap(tmp_path):
    cfg = tmp_path / "dsr.yaml"
    cfg.write_text(
        "spark:\n  master: spark://127.0.0.1:7077\n"
        "  conf: {spark.executor.memory: 2g, spark.sql.adaptive.enabled: true}\n"
        "catalog:\n  name: prod\n  properties: {type: rest, uri: 'http://127.0.0.1:8181'}\n"
        "datamap:\n  tables:\n    crm.contacts: {key: contact_id}\n"
    )
    s = load_settings(cfg)
    assert s.spark.master == "spark://127.0.0.1:7077"
    assert s.spark.conf == {"spark.executor.memory": "2g", "spark.sql.adaptive.enabled": "true"}
    assert s.catalog.properties == {"type": "rest", "uri": "http://127.0.0.1:8181"}
    assert list(s.datamap.tables) == ["crm.contacts"]
    assert s.datamap.tables["crm.contacts"].identifier == "user_id"
    assert s.table("crm.contacts") == "`prod`.`crm`.`contacts`"


@pytest.mark.parametrize(
    "text, message",
    [
        ("spark: [unclosed", "not valid YAML"),
        ("- a list", "top level must be a mapping"),
        ("spark: {mastr: local}", "spark.mastr"),
        ("catalog: {name: 'bad name'}", "plain identifier"),
        ("delta: {catalog: 'spark_catalog; DROP'}", "delta.catalog 'spark_catalog; DROP' must be a plain identifier"),
        ("purge: {pinned_refs: ignore}", "purge.pinned_refs"),
        ("datamap: {tables: {}}", "lists no tables"),
        ("datamap: {tables: {events: {key: user_id}}}", "namespace.table"),
        ("datamap: {tables: {demo.t: {key: 'user id'}}}", "column name or a struct path"),
        ("datamap: {tables: {demo.t: {key: k, keys: {k: {}}}}}", "demo.t.*not both"),
        ("datamap: {tables: {demo.t: {action: redact}}}", "demo.t.*not neither"),
        ("datamap: {tables: {demo.t: {action: redact, keys: {a: {redact: [a]}, b: {redact: [x]}}}}}",
         "demo.t.*key 'b': its redact group must include the key column"),
        ("datamap: {tables: {demo.t: {keys: {a: {redact: [a]}}}}}", "demo.t.*only meaningful with action: redact"),
        ("datamap: {tables: {demo.t: {keys: {a: {identifier: email}}}}}", "demo.t, key a.*neither the subject"),
        ("datamap: {tables: {demo.t: {keys: {'a..b': {}}}}}", "column name or a struct path"),
        ("datamap: {tables: {demo.t: {keys: {'a[][]': {}}}}}", "column name or a struct path"),
        ("datamap: {tables: {demo.t: {action: redact, keys: {a: {redact: [a, 'b[]']}}}}}",
         "only allowed for the group's own key column"),
        ("datamap: {tables: {demo.t: {key: k, action: redact}}}", "needs the list of columns"),
        ("datamap: {tables: {demo.t: {key: k, action: redact, redact: [name]}}}", "must include the key column"),
        ("datamap: {tables: {demo.t: {key: k, redact: [k]}}}", "only meaningful with action: redact"),
        ("datamap: {tables: {demo.t: {key: email, identifier: email}}}", "neither the subject"),
        ("datamap: {tables: {demo.t: {key: k, action: erase}}}", "action"),
        ("datamap: {tables: {demo.t: {key: k, exempt: ' '}}}", "demo.t.*exempt: give the exemption"),
        ("datamap: {tables: {demo.t: {key: k, action: shred, exempt: tax}}}", "demo.t.*cannot be exempt on its own"),
        ("datamap: {tables: {demo.t: {key: k, exempt: tax}}, derived: {demo.g: {from: [demo.t], sql: 'SELECT 1',"
         " group_by: [x]}}}", "demo.g is recomputed from demo.t, which is exempt.*mark it exempt too"),
        ("datamap: {tables: {demo.t: {key: k}}, topics: {clicks: {key: user_id}}}",
         "lists topics: give the cluster that holds them, kafka: {bootstrap_servers"),
        ("kafka: {bootstrap_servers: 'h:9'}\ndatamap: {tables: {demo.t: {key: k}}, topics: {'a b': {}}}",
         "'a b' is not a Kafka topic name"),
        ("kafka: {bootstrap_servers: 'h:9'}\ndatamap: {tables: {demo.t: {key: k}}, topics: {c: {identifier: email}}}",
         "topic c, key email: identifier 'email' is neither the subject"),
        ("kafka: {bootstrap_servers: 'h:9'}\ndatamap: {tables: {demo.t: {key: k}}, topics: {c: {key: 'a b'}}}",
         "column name or a struct path"),
        ("kafka: {bootstrap_servers: 'h:9'}\ndatamap: {tables: {demo.t: {key: k}}, topics: {c: {accept_retention: ''"
         "}}}",
         "accept_retention"),
        ("kafka: {servers: 'h:9'}", "kafka.bootstrap_servers"),
        ("datamap: {tables: {demo.t: {key: k}}, derived: {demo.h: {from: [demo.t], key: k, kind: scd2, "
         "propagation: pipeline}}}", "an SCD type 2 pipeline only marks a deleted source row expired"),
        ("datamap: {tables: {demo.t: {key: k}}, derived: {demo.g: {from: [demo.t], sql: 'SELECT 1', refresh: full, "
         "propagation: pipeline}}}", "propagation: pipeline is for a table carrying the subject's key"),
        ("datamap: {tables: {demo.t: {key: k}}, derived: {demo.s: {from: [demo.t], key: k, propagation: pipeline, "
         "wait_seconds: 0}}}", "wait_seconds"),
        ("kafka: {bootstrap_servers: 'h:9', 'Bad Name': x}", "'Bad Name' is not a Kafka client property name"),
    ],
)
def test_bad_config_gets_a_clear_error(tmp_path, text, message):
    cfg = tmp_path / "dsr.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(cfg)


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")


def test_relative_paths_are_read_from_the_config_folder(tmp_path):
    s = settings_from_dict({"catalog": {"properties": {"type": "hadoop", "warehouse": "wh"}},
                            "secret_key_file": "keys/k"}, base=tmp_path)
    assert s.catalog.properties["warehouse"] == (tmp_path / "wh").as_uri()
    assert s.secret_key_file == tmp_path / "keys" / "k"


def test_erase_order_puts_identity_sources_last():
    assert demo_datamap(derived=False).erase_order()[-1] == "demo.users"
    # derived tables after every table they read
    assert demo_datamap().erase_waves() == [["demo.events", "demo.newsletter", "demo.orders"], ["demo.users"],
                                           ["demo_gold.daily_by_type", "demo_gold.top_visitors",
                                            "demo_silver.user_daily", "demo_silver.user_history"]]


def test_datamap_checked_against_catalog(spark, new_lakehouse):
    settings = new_lakehouse(users=5, events=10)
    types = check_against_catalog(spark, settings.datamap, settings.table)
    assert types["demo.events"]["user_id"].simpleString() == "string"
    bad = DataMap.model_validate({
        "identifiers": {"email": {"table": "demo.users", "subject_column": "user_id", "column": "mail"}},
        "tables": {"demo.events": {"key": "uid"}, "demo.missing": {"key": "user_id"},
                   "demo.orders": {"key": "user_id", "action": "redact", "redact": ["user_id", "nope"]},
                   "demo.newsletter": {"keys": {"email": {}, "email.domain": {}, "email[]": {}}}},
    })
    with pytest.raises(DataMapError) as info:
        check_against_catalog(spark, bad, settings.table)
    text = str(info.value)
    assert "table demo.events has no column 'uid' (has: event_id, user_id," in text
    assert "demo.missing cannot be read" in text
    assert "table demo.orders has no column 'nope'" in text
    assert "table demo.users has no column 'mail'" in text
    assert "table demo.newsletter column 'email.domain': email is a string, not a struct" in text
    assert "table demo.newsletter: key column 'email[]' has type string, not an array" in text


def test_complex_key_type_is_rejected(spark, new_lakehouse):
    settings = new_lakehouse(users=5, events=10)
    spark.sql(f"CREATE TABLE {settings.table('demo.nested')} (k struct<a: string>) USING iceberg")
    dm = DataMap.model_validate({"tables": {"demo.nested": {"key": "k"}}})
    with pytest.raises(DataMapError, match="cannot hold an identifier"):
        check_against_catalog(spark, dm, settings.table)
    spark.sql(f"CREATE TABLE {settings.table('demo.listed')} (k array<string>) USING iceberg")
    dm = DataMap.model_validate({"tables": {"demo.listed": {"key": "k"}}})
    with pytest.raises(DataMapError, match=r"cannot hold an identifier \(an array of identifiers is written k\[\]\)"):
        check_against_catalog(spark, dm, settings.table)


def test_example_config_in_readme_folder_is_valid():
    example = Path(__file__).parent.parent / "examples" / "dsr.yaml"
    settings = load_settings(example)
    assert settings.datamap.tables["demo.orders"].action == "redact"


def test_settings_are_frozen_and_changed_by_copy(tmp_path):
    """Stages and threads share one Settings: after validation it cannot change in place; `replace`
    makes a changed copy (one field of a section, or a whole value) and leaves the original alone."""
    settings = settings_from_dict({"export": {"directory": "out", "format": "json"}}, base=tmp_path)
    with pytest.raises(ValidationError, match="frozen"):
        settings.export.format = "csv"
    with pytest.raises(ValidationError, match="frozen"):
        settings.ledger_namespace = "other"
    changed = settings.replace(export={"format": "csv"}, ledger_namespace="other")
    assert (changed.export.format, changed.export.directory, changed.ledger_namespace) == (
        "csv", (tmp_path / "out").resolve(), "other")
    assert (settings.export.format, settings.ledger_namespace) == ("json", "dsr")
    assert changed.catalog is settings.catalog  # untouched sections are shared, not copied


def test_kafka_client_properties_sit_beside_the_servers(tmp_path, monkeypatch):
    cfg = tmp_path / "dsr.yaml"
    cfg.write_text("kafka: {bootstrap_servers: 'b1:9092,b2:9092', security.protocol: SASL_SSL, "
                   "sasl.password: '${KAFKA_SECRET}', enable.idempotence: true}\n"
                   "datamap: {tables: {demo.t: {key: k}}, topics: {clicks: {}, profiles: {key: contact.email, "
                   "identifier: email}}, identifiers: {email: {table: demo.u, subject_column: user_id, "
                   "column: email}}}")
    monkeypatch.setenv("KAFKA_SECRET", "s3cret")
    settings = load_settings(cfg)
    assert settings.kafka.client_properties() == {"bootstrap.servers": "b1:9092,b2:9092",
                                                  "security.protocol": "SASL_SSL", "sasl.password": "s3cret",
                                                  "enable.idempotence": "true"}
    assert settings.kafka.admin_properties() == settings.kafka.client_properties()  # nothing of one client's own
    both = settings.kafka.model_copy(update={"admin": {"sasl.username": "dsr"}, "spark": {"sasl.jaas.config": "x"}})
    assert both.admin_properties()["sasl.username"] == "dsr" and "sasl.jaas.config" not in both.admin_properties()
    assert both.spark_properties()["sasl.jaas.config"] == "x" and "sasl.username" not in both.spark_properties()
    topics = settings.datamap.topics
    assert (topics["clicks"].field, topics["clicks"].identifier) == ("user_id", "user_id")  # the subject by default
    assert (topics["profiles"].field, topics["profiles"].identifier) == ("contact.email", "email")
