"""System tests: real processes, real sockets, DynamoDB Local, scaled timings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system.procscan import new_marker, reap


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/system/" in str(item.fspath):
            item.add_marker(pytest.mark.system)


@pytest.fixture
def marker() -> Iterator[str]:
    """A value every process the test starts inherits; whatever still has it at the end is killed,
    so a failing or timed-out test cannot leak a fleet into the next one."""
    value = new_marker()
    yield value
    reap(value)
