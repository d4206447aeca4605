"""`tianji controller backup FILE` and `restore FILE` on both backends (controller/state/backup.py): a backup taken
while the controller serves; a restore with it stopped brings back the backup's state, and every host following
its stream and every gateway watching takes it in one answer; what was handed out after the backup (a VNI, an
EIP) is not handed out again; a host ahead of a restored database (its old one lost) gets a whole config; a
restore under a serving controller, of another backend's backup, a newer schema's or a broken file is refused and
changes nothing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.api.test_config_stream import Follower
from tests.conftest import Controller, backends
from tests.support.controller import PgDatabase
from tests.support.wait import wait_for
from tianji.southbound import HostConfig


class Cluster:
    """A controller on `backend` that can be stopped and started again on the same port and database."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.pg = PgDatabase() if backend == "postgres" else None
        self.state = tmp_path / "state"
        self.url = self.pg.url if self.pg else None
        self.c: Controller | None = Controller(self.state, self.url)
        self.port = self.c.port

    def cli(self, *args: str) -> tuple[int, str]:
        opts = ["--state-dir", str(self.state)] + (["--database-url", self.url] if self.url else [])
        # a process of its own, as an operator runs it (a restore looks for other processes holding the database)
        r = subprocess.run([str(Path(sys.executable).parent / "tianji"), "controller", *args, *opts],
                           capture_output=True, text=True, timeout=120, env=os.environ | {"COLUMNS": "400"})
        return r.returncode, r.stdout + r.stderr

    def stop(self) -> None:
        assert self.c is not None
        self.c.stop()
        self.c.db.engine.dispose()  # its pooled connections too: a restore waits for no one
        self.c = None
        if self.pg:  # its leadership and LISTEN sessions end on their threads: as a process's would at its exit
            wait_for(lambda: not self._sessions(), 15, "the stopped controller's sessions gone")

    def _sessions(self) -> int:
        assert self.pg is not None
        with self.pg.admin.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"),
                                {"d": self.pg.name}).scalar()

    def start(self) -> Controller:
        self.c = Controller(self.state, self.url, port=self.port)
        return self.c

    def close(self) -> None:
        if self.c is not None:
            self.stop()
        if self.pg:
            self.pg.drop()


@pytest.fixture(params=backends())
def cluster(request: pytest.FixtureRequest, tmp_path: Path):
    cl = Cluster(request.param, tmp_path)
    try:
        yield cl
    finally:
        cl.close()


def _world(c: Controller) -> dict:
    """A host following its stream, a gateway instance, a tenant's VPC with a port on the host and an EIP."""
    c.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    c.admin.post("/v1/hosts", {"name": "gw1", "vtep_ip": "172.31.0.9", "kind": "gateway"})
    c.admin.post("/v1/eip-pools", {"cidr": "198.51.100.0/28"})
    t = c.tenant("acme")
    vpc = t.post("/v1/vpcs", {"name": "one", "cidr": "10.1.0.0/16"})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.1.0.0/24"})
    c.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
    return {"tenant": t, "vpc": vpc, "eip": t.post("/v1/eips", {}),
            "hv1": c.admin.post("/v1/host-tokens", {"host": "hv1"})["token"],
            "gw1": c.admin.post("/v1/host-tokens", {"host": "gw1", "kind": "gateway"})["token"]}


def _after_backup(c: Controller, w: dict) -> dict:
    """What only the replaced database will have: a VPC with a port on hv1, an EIP, a host."""
    t = w["tenant"]
    vpc = t.post("/v1/vpcs", {"name": "two", "cidr": "10.2.0.0/16"})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.2.0.0/24"})
    c.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "b", "host": "hv1"})
    c.admin.post("/v1/hosts", {"name": "hv2", "vtep_ip": "172.31.0.2"})
    return {"vpc": vpc, "eip": t.post("/v1/eips", {})}


def _gateway_delta(c: Controller, token: str, after: int) -> httpx.Response:
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as g:
        return g.get("/v1/gateways/gw1/config/delta", params={"after": after, "timeout": 0})


def test_a_restore_brings_the_backup_back_and_every_watcher_takes_it_once(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster.c
    assert c is not None
    w = _world(c)
    f = Follower(c, "hv1", w["hv1"])
    try:
        wait_for(lambda: f.cfg is not None, 10, "hv1's first config")
        code, out = cluster.cli("backup", str(tmp_path / "b.tjbackup"))
        assert code == 0, out
        assert "backed up revision" in out and "1 vpcs" in out
        later = _after_backup(c, w)
        now = HostConfig.model_validate(c.admin.get("/v1/hosts/hv1/config"))
        wait_for(lambda: f.cfg == now, 10, "hv1 holding the second VPC and hv2's VTEP")
        live, held, events = c.db.revision(), f.cfg.revision, f.events
        gw_at = int(_gateway_delta(c, w["gw1"], -1).headers["X-Tianji-Revision"])
        cluster.stop()

        restored_at = datetime.now(UTC)
        code, out = cluster.cli("restore", str(tmp_path / "b.tjbackup"))
        assert code == 0, out
        assert f"{later['vpc']['vni']}" in out and later["eip"]["address"] in out and "hv2" in out  # said
        assert list(cluster.state.glob("before-restore-*.tjbackup")), "what it replaced is kept"
        c = cluster.start()
        assert c.db.revision() > live  # never back: every watcher's `after` is behind it
        names = {v["name"] for v in c.admin.get("/v1/vpcs")}
        assert names == {"one"}
        assert {h["name"] for h in c.admin.get("/v1/hosts")} == {"hv1", "gw1"}

        whole = HostConfig.model_validate(c.admin.get("/v1/hosts/hv1/config"))
        wait_for(lambda: f.cfg == whole, 15, "hv1's config, from its stream, equal to the restored whole config")
        assert f.events == events + 1, "one delta took the host back"
        assert f.last is not None and f.last.base == held, "a delta from what it held, not a whole config"
        assert later["vpc"]["id"] not in {v.id for v in f.cfg.vpcs}
        r = _gateway_delta(c, w["gw1"], gw_at)
        assert r.status_code == 200 and int(r.headers["X-Tianji-Revision"]) > gw_at

        t = c.tenant("newcomer")
        v3 = t.post("/v1/vpcs", {"name": "three", "cidr": "10.3.0.0/16"})
        assert v3["vni"] != later["vpc"]["vni"], "the VNI handed out after the backup rests in quarantine"
        assert t.post("/v1/eips", {})["address"] not in (w["eip"]["address"], later["eip"]["address"])
        audit = c.admin.get("/v1/audit", since=restored_at.isoformat())
        assert any(e["method"] == "RESTORE" for e in audit), audit
    finally:
        f.close()


def test_a_host_ahead_of_a_restored_database_gets_a_whole_config(cluster: Cluster, tmp_path: Path) -> None:
    """The database was lost and restored elsewhere without its epoch: hv1 holds revisions it never had."""
    c = cluster.c
    assert c is not None
    w = _world(c)
    assert cluster.cli("backup", str(tmp_path / "b.tjbackup"))[0] == 0
    f = Follower(c, "hv1", w["hv1"])
    try:
        later = _after_backup(c, w)
        for i in range(20):  # hv1 gets well ahead of the backup
            w["tenant"].post("/v1/vpcs", {"name": f"x{i}", "cidr": f"10.{100 + i}.0.0/16"})
        wait_for(lambda: f.cfg is not None and later["vpc"]["id"] in {v.id for v in f.cfg.vpcs}, 10, "hv1 caught up")
        held = f.cfg.revision
        gw_at = int(_gateway_delta(c, w["gw1"], -1).headers["X-Tianji-Revision"])
        cluster.stop()
        fresh = tmp_path / "elsewhere"  # a new machine: the operator's admin token, an empty database
        fresh.mkdir()
        (fresh / "admin.token").write_text((cluster.state / "admin.token").read_text())
        if cluster.pg:
            cluster.pg.drop()
            cluster.pg = PgDatabase()
            cluster.url = cluster.pg.url
        cluster.state = fresh
        code, out = cluster.cli("restore", str(tmp_path / "b.tjbackup"))
        assert code == 0, out
        c = cluster.start()
        assert c.db.revision() < held
        whole = HostConfig.model_validate(c.admin.get("/v1/hosts/hv1/config"))
        wait_for(lambda: f.cfg == whole, 15, "hv1 back to the restored config")
        assert f.last is not None and f.last.base == -1, "a whole config: no stamp is after what it held"
        r = _gateway_delta(c, w["gw1"], gw_at)
        assert r.status_code == 200 and r.json()["base"] == -1
    finally:
        f.close()


def _tamper(src: Path, dst: Path, **changes: object) -> None:
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read()
            if m.name == "manifest.json":
                data = json.dumps(json.loads(data) | changes).encode()
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data))


def test_a_restore_that_cannot_be_done_changes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster.c
    assert c is not None
    _world(c)
    good = tmp_path / "b.tjbackup"
    assert cluster.cli("backup", str(good))[0] == 0
    before = c.snapshot()
    code, out = cluster.cli("restore", str(good))
    assert code == 4 and "stop" in out, out  # the controller serves it
    assert c.snapshot() == before
    c.tenant("after")
    before = c.snapshot()
    cluster.stop()
    other = "postgresql" if cluster.pg is None else "sqlite"
    cases = {"another backend": {"backend": other}, "a newer schema": {"schema": "9999_future"},
             "another format": {"format": "tianji-backup/99"}}
    for what, change in cases.items():
        _tamper(good, tmp_path / "bad.tjbackup", **change)
        code, out = cluster.cli("restore", str(tmp_path / "bad.tjbackup"))
        assert code == 2, (what, out)
    (tmp_path / "junk.tjbackup").write_bytes(b"not a backup")
    code, out = cluster.cli("restore", str(tmp_path / "junk.tjbackup"))
    assert code == 2 and "not a readable Tianji backup" in out, out
    assert not list(cluster.state.glob("before-restore-*")), "refused before anything was kept or loaded"
    c = cluster.start()
    assert c.snapshot() == before
