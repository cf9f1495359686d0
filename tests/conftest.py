"""Shared fixtures: a real PostgreSQL server for the distributed tests (started here), the
loop watch (``pytest.mark.loop_watch``: a test fails when the trio loop is blocked), and
every test's time limit (pytest-timeout; a trio test is cancelled at it: tests/time_limit.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import loop_watch
import module_progress
import pytest
from agui_schema_check import agui_events_follow_the_schema
from loop_watch import pytest_runtest_call
from pg_cluster import fresh_database, postgres_cluster
from time_limit import (
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_timeout_cancel_timer,
    pytest_timeout_set_timer,
)

__all__ = [
    "agui_events_follow_the_schema",
    "pg_server",
    "pg_url",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_runtest_call",
    "pytest_timeout_cancel_timer",
    "pytest_timeout_set_timer",
]

_databases = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    loop_watch.pytest_configure(config)
    module_progress.register(config)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One PostgreSQL cluster for the session, started on first use, stopped at the end."""
    with postgres_cluster() as url:
        yield url


@pytest.fixture
def pg_url(pg_server: str) -> str:
    """An empty database of its own for one test."""
    return fresh_database(pg_server, f"t{next(_databases)}")
