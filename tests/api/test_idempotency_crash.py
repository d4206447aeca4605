"""`Idempotency-Key` across a process's death: a controller killed (as kill -9 would: `TIANJI_FAILPOINT`) before
its keyed create commits, after it commits but before its answer is kept, and after the answer is kept; the retry
on a controller started after it (a surviving replica) gets the first answer or creates exactly once, at once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import backends
from tests.support.controller import PgDatabase, free_port
from tests.support.wait import wait_for

TIANJI = str(Path(sys.executable).parent / "tianji")


@contextmanager
def replica(state: Path, db_url: str | None, failpoint: str = "") -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    env = os.environ | {"TIANJI_RATE_LIMIT": "0", "TIANJI_FAILPOINT": failpoint}
    if db_url:
        env["TIANJI_DATABASE_URL"] = db_url
    log = open(state / f"log-{port}", "w")
    proc = subprocess.Popen([TIANJI, "controller", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--state-dir", str(state), "--insecure-http", "--log-level", "warning"],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answering, 60, "the controller answering")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.fixture(params=backends())
def db_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
        return
    pg = PgDatabase()
    try:
        yield pg.url
    finally:
        pg.drop()


@pytest.mark.parametrize("point", ["idempotency.before-commit", "idempotency.after-commit",
                                   "idempotency.after-answer"])
def test_a_retry_after_the_writer_died_answers_once_and_at_once(tmp_path: Path, db_url: str | None,
                                                                 point: str) -> None:
    with replica(tmp_path, db_url, failpoint=point) as (proc, url):
        admin = httpx.Client(base_url=url, timeout=30,
                             headers={"Authorization": f"Bearer {(tmp_path / 'admin.token').read_text().strip()}"})
        t = admin.post("/v1/tenants", json={"name": "acme"}).json()
        tenant = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {t['token']}"})
        vpc = tenant.post("/v1/vpcs", json={"name": "prod", "cidr": "10.0.0.0/16"}).json()
        sn = tenant.post("/v1/subnets", json={"vpc_id": vpc["id"], "name": "web", "cidr": "10.0.1.0/24"}).json()
        body = {"subnet_id": sn["id"], "name": "vm1"}
        with pytest.raises(httpx.TransportError):  # the process dies at the point: no answer
            tenant.post("/v1/ports", json=body, headers={"Idempotency-Key": "create-vm1"})
        assert proc.wait(10) == 137
    with replica(tmp_path, db_url) as (_proc, url):
        tenant = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {t['token']}"})
        r = tenant.post("/v1/ports", json=body, headers={"Idempotency-Key": "create-vm1"})
        assert r.status_code == 201, r.text
        ports = [p for p in tenant.get("/v1/ports").json() if p["name"] == "vm1"]
        assert len(ports) == 1 and r.json()["id"] == ports[0]["id"], (r.json(), ports)
        assert r.json()["ip"] == ports[0]["ip"] and r.json()["mac"] == ports[0]["mac"]
        said = {"idempotency.before-commit": None, "idempotency.after-commit": "derived",
                "idempotency.after-answer": "true"}[point]
        assert r.headers.get("idempotent-replayed") == said
        again = tenant.post("/v1/ports", json=body, headers={"Idempotency-Key": "create-vm1"})
        assert again.status_code == 201 and again.json()["id"] == ports[0]["id"]
        assert again.headers["idempotent-replayed"] in ("true", "derived")
