"""Shared fixtures: a real PostgreSQL server for the distributed tests (started here)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from pg_cluster import fresh_database, postgres_cluster

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
