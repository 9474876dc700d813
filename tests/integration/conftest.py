"""Integration set-ups (make test-integration): real servers on 127.0.0.1, each started and stopped by its test."""

from __future__ import annotations

import pytest

TIMES: dict[str, dict[str, float]] = {}


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter):
    if not TIMES:
        return
    terminalreporter.section("full cycle per set-up (seconds)")
    steps = list(next(iter(TIMES.values())))
    terminalreporter.write_line(f"{'set-up':<28}" + "".join(f"{s:>10}" for s in steps))
    for name, times in TIMES.items():
        terminalreporter.write_line(f"{name:<28}" + "".join(f"{times.get(s, 0):>10.1f}" for s in steps))
