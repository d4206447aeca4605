"""The rolling upgrade's cluster: the emulated `small` cluster started on the previous release
(topologies/releases.py), two controller replicas on PostgreSQL, as production runs. Its own pytest run
(scripts/run-tests.sh, `make upgrade-test`): the scenario suite's cluster holds the same addresses."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scenarios.conftest import STATE, require_prerequisites, tenants  # noqa: F401 -- the fixture, here too
from tests.support.controller import PgDatabase
from topologies.cluster import Cluster
from topologies.cluster_state import State
from topologies.releases import install

NAME = "tju"


@pytest.fixture(scope="session")
def previous() -> str:
    return install(progress=print)


@pytest.fixture(scope="session")
def cluster(previous: str) -> Iterator[Cluster]:
    require_prerequisites()
    if (STATE / NAME / "state.json").exists():  # a crashed earlier run: remove exactly what it made
        Cluster(State.load(STATE / NAME)).down()
    db = PgDatabase()  # replicas need it, and the upgrade migrates it while one of them serves
    try:
        c = Cluster.up("small", name=NAME, state_dir=STATE, database_url=db.url, controllers=2, release=previous,
                       progress=lambda m: None)
        try:
            yield c
        finally:
            if keep := os.environ.get("TIANJI_SCENARIO_LOGS"):
                Path(keep).mkdir(parents=True, exist_ok=True)
                for log in Path(c.state.dir).rglob("*.log"):
                    shutil.copy(log, Path(keep) / "-".join(("upgrade", *log.relative_to(c.state.dir).parts)))
            c.down()
    finally:
        db.drop()
