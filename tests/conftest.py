"""Shared fixtures: a real controller (uvicorn in a thread) on SQLite or PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from controller.state.db import Database
from tests.support.controller import Controller, PgDatabase, free_port

__all__ = ["Controller", "PgDatabase", "free_port", "backends", "pg_wanted", "served"]

# Property tests assert behaviour, not speed: with the emulated cluster busy on two cores an example can take
# longer than hypothesis's 200 ms deadline, which failed test_ipam once.
hypothesis_settings.register_profile("tianji", deadline=None)
hypothesis_settings.load_profile("tianji")


def pg_wanted() -> bool:
    """Whether the PostgreSQL half runs. Off only on request (TIANJI_TEST_PG=0, said loudly by make test), and
    never in CI: there a missing prerequisite fails the run rather than leaving a backend out."""
    if os.environ.get("TIANJI_TEST_PG", "1") == "1":
        return True
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but TIANJI_TEST_PG=0: the PostgreSQL tests must run in CI", pytrace=False)
    return False



def backends() -> list[str]:
    return ["sqlite", "postgres"] if pg_wanted() else ["sqlite"]


@contextmanager
def served(backend: str, tmp_path: Path, **settings: object) -> Iterator[Controller]:
    """A controller with these settings on `backend` (a throwaway PostgreSQL database, or SQLite in tmp_path)."""
    pg = PgDatabase() if backend == "postgres" else None
    c = Controller(tmp_path / "state", pg.url if pg else None, **settings)
    try:
        yield c
    finally:
        c.stop()
        if pg:
            pg.drop()


@pytest.fixture(params=backends())
def controller(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Controller]:
    with served(request.param, tmp_path) as c:
        yield c


@contextmanager
def migrated(backend: str, tmp_path: Path) -> Iterator[Database]:
    """A migrated database on `backend` (a throwaway PostgreSQL database, or SQLite in tmp_path), no controller."""
    pg = PgDatabase() if backend == "postgres" else None
    db = Database(pg.url if pg else f"sqlite:///{tmp_path / 't.db'}")
    try:
        db.migrate()
        yield db
    finally:
        db.engine.dispose()
        if pg:
            pg.drop()


@pytest.fixture(params=backends())
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A migrated database of each backend, without a controller."""
    with migrated(request.param, tmp_path) as db:
        yield db


@pytest.fixture
def pg_database(tmp_path: Path) -> Iterator[Database]:
    """A migrated PostgreSQL database, for what only PostgreSQL does (row locks)."""
    if not pg_wanted():  # fails under CI=true
        pytest.skip("PostgreSQL half disabled (TIANJI_TEST_PG=0): see the warning printed by make test")
    with migrated("postgres", tmp_path) as db:
        yield db


@pytest.fixture
def pg_controller(tmp_path: Path) -> Iterator[Controller]:
    if not pg_wanted():  # fails under CI=true
        pytest.skip("PostgreSQL half disabled (TIANJI_TEST_PG=0): see the warning printed by make test")
    with served("postgres", tmp_path) as c:
        yield c
