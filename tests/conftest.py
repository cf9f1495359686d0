"""Shared fixtures: a real PostgreSQL server for the distributed tests (started here), and
the loop watch (``pytest.mark.loop_watch``: a test fails when the trio loop is blocked)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from loop_watch import pytest_configure, pytest_runtest_call
from pg_cluster import fresh_database, postgres_cluster

__all__ = ["pg_server", "pg_url", "pytest_configure", "pytest_runtest_call"]

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One PostgreSQL cluster for the session, started on first use, stopped at the end."""
    with postgres_cluster() as url:
        yield url


@pytest.fixture
def pg_url(pg_server: str) -> str:
    """An empty database of its own for one test."""
    return fresh_database(pg_server, f"t{next(_databases)}")
