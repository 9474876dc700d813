"""Integration set-ups (make test-integration): real servers on 127.0.0.1, each started and stopped by its test."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from lakehouse_dsr.lake.broker import LocalBroker

TIMES: dict[str, dict[str, float]] = {}  # wall clock of each dsr command, per set-up
STAGES: dict[str, dict[str, float]] = {}  # the run report's seconds per stage, per set-up


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> Iterator[LocalBroker]:
    """A Kafka broker on 127.0.0.1 (lake/broker.py: KRaft, one node, ~5 s to start; its jars fetched
    through mvn once per machine, `make integration-deps` does) shared by a test process's tests, which
    name their own topics; stopped, its data removed, when the process's tests end."""
    with LocalBroker(parent=tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def _table(terminalreporter, title: str, rows: dict[str, dict[str, float]]) -> None:
    if not rows:
        return
    terminalreporter.section(title)
    columns = list(dict.fromkeys(c for row in rows.values() for c in row))
    terminalreporter.write_line(f"{'set-up':<30}" + "".join(f"{c[:10]:>11}" for c in columns))
    for name, row in rows.items():
        terminalreporter.write_line(f"{name:<30}" + "".join(f"{row.get(c, 0):>11.1f}" for c in columns))


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its set-ups' times go to the controller's summary
        workeroutput["dsr_times"] = json.dumps([TIMES, STAGES])


def pytest_testnodedown(node, error):  # pytest-xdist's controller, as each worker ends
    times, stages = json.loads(getattr(node, "workeroutput", {}).get("dsr_times", "[{}, {}]"))
    TIMES.update(times)
    STAGES.update(stages)


def pytest_terminal_summary(terminalreporter):
    _table(terminalreporter, "full cycle per set-up: seconds per dsr command", TIMES)
    _table(terminalreporter, "inside dsr run: seconds per stage (run report)", STAGES)
