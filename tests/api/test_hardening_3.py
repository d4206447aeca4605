"""Hardening III: each finding of the third review (the API side), on both backends where a database is involved;
each of these failed before its fix."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Controller, backends, served


@pytest.mark.parametrize("where", ["empty", "path"])
def test_sqlite_files_are_private_whatever_the_setting(tmp_path: Path, where: str) -> None:
    """TIANJI_DATABASE_URL set but empty means unset (the state directory's tianji.db); a sqlite:/// path of one's
    own is private too: the database, its -wal and -shm files 0600 (it holds token hashes and MD5 keys)."""
    url = "" if where == "empty" else f"sqlite:///{tmp_path / 'elsewhere' / 'my.db'}"
    code = ("from controller.app import create_app; a = create_app(announce_token=False); "
            "a.state.db.engine.connect().close()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=os.environ | {"TIANJI_STATE_DIR": str(tmp_path / "state"), "TIANJI_DATABASE_URL": url})
    assert r.returncode == 0, r.stderr
    db = tmp_path / "state" / "tianji.db" if where == "empty" else tmp_path / "elsewhere" / "my.db"
    files = [f for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")) if f.exists()]
    assert db in files and not (tmp_path / "tianji.db").exists()
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_an_empty_setting_is_unset(tmp_path: Path) -> None:
    from controller.settings import Settings

    s = Settings.from_env(state_dir=tmp_path, database_url="")
    assert s.database_url is None and s.sqlite_path == tmp_path / "tianji.db"
    os.environ["TIANJI_DATABASE_URL"] = ""
    try:
        assert Settings(state_dir=tmp_path).database_url is None
    finally:
        del os.environ["TIANJI_DATABASE_URL"]


@pytest.fixture(params=backends())
def ops(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Controller]:
    with served(request.param, tmp_path, service_network="100.100.0.0/16",
                service_source_pool="100.100.0.240/28", underlay_cidrs=["172.31.0.0/16"]) as c:
        yield c


def test_eip_pools_stay_apart_from_everything_else_and_can_be_deleted(ops: Controller) -> None:
    adm = ops.raw(ops.admin_token)
    assert adm.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "192.0.2.11"}).status_code == 200
    for cidr, named in (("100.100.0.240/28", "source pool 100.100.0.240/28"),
                        ("100.100.5.0/24", "service network 100.100.0.0/16"),
                        ("172.31.5.0/24", "underlay network 172.31.0.0/16"),
                        ("192.0.2.0/24", "host hv1's VTEP 192.0.2.11")):
        r = adm.post("/v1/eip-pools", json={"cidr": cidr})
        assert r.status_code == 409 and named in r.json()["detail"] and r.json()["field"] == "cidr", r.text
    assert adm.get("/v1/eip-pools").json() == []
    pool = adm.post("/v1/eip-pools", json={"cidr": "198.51.100.0/24"}).json()
    r = adm.post("/v1/eip-pools", json={"cidr": "198.51.100.128/25"})
    assert r.status_code == 409 and "EIP pool 198.51.100.0/24" in r.json()["detail"]
    # whichever comes first: a VTEP or a service in a pool is refused too
    r = adm.post("/v1/hosts", json={"name": "hv2", "vtep_ip": "198.51.100.7"})
    assert r.status_code == 409 and r.json()["field"] == "vtep_ip" and "198.51.100.0/24" in r.json()["detail"]
    r = adm.patch("/v1/hosts/hv1", json={"vtep_ip": "198.51.100.8"})
    assert r.status_code == 409 and r.json()["field"] == "vtep_ip"
    assert adm.get("/v1/hosts/hv1").json()["vtep_ip"] == "192.0.2.11"
    svc = adm.post("/v1/services", json={"name": "store", "addresses": ["100.100.1.1"],
                                         "ports": [{"protocol": "tcp", "port": 80}]})
    assert svc.status_code == 201, svc.text
    # a pool is deleted once none of its addresses is a tenant's
    t = ops.tenant()
    eip = t.post("/v1/eips", {})
    r = adm.delete(f"/v1/eip-pools/{pool['id']}")
    assert r.status_code == 409 and "1 allocated" in r.json()["detail"] and r.json()["field"] == "eip_pool_id"
    t.delete(f"/v1/eips/{eip['id']}")
    assert adm.delete(f"/v1/eip-pools/{pool['id']}").status_code == 204
    assert adm.get("/v1/eip-pools").json() == []
    assert adm.delete(f"/v1/eip-pools/{pool['id']}").status_code == 404
    assert t.http.post("/v1/eips", json={}).status_code == 409  # no public addresses left


def test_deleting_an_empty_tenant_revokes_its_tokens(ops: Controller) -> None:
    t = ops.tenant()
    t.post(f"/v1/tenants/{t.tenant_id}/tokens", {"name": "ci"})
    adm = ops.raw(ops.admin_token)
    assert adm.delete(f"/v1/tenants/{t.tenant_id}").status_code == 204
    assert t.http.get("/v1/vpcs").status_code == 401  # its tokens went with it
    assert adm.get(f"/v1/tenants/{t.tenant_id}").status_code == 404
    busy = ops.tenant()
    busy.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    r = adm.delete(f"/v1/tenants/{busy.tenant_id}")
    assert r.status_code == 409 and "1 vpcs" in r.json()["detail"] and "token" not in r.json()["detail"]


def test_a_published_load_balancer_learns_nothing_of_its_consumers_and_lists_are_checked_alike(
        ops: Controller) -> None:
    prov = ops.tenant()
    pvpc = prov.post("/v1/vpcs", {"name": "prov", "cidr": "10.9.0.0/16"})
    psn = prov.post("/v1/subnets", {"vpc_id": pvpc["id"], "name": "s", "cidr": "10.9.1.0/24"})
    lb = prov.post("/v1/load-balancers", {"name": "api", "vpc_id": pvpc["id"], "subnet_id": psn["id"]})
    prov.post(f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "tcp", "port": 443})
    cons = ops.tenant()
    cvpc = cons.post("/v1/vpcs", {"name": "very-secret-project", "cidr": "10.0.0.0/16"})
    csn = cons.post("/v1/subnets", {"vpc_id": cvpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    # a tenant's list: an id of no tenant and an existing tenant's id get the same answer
    raw = ops.raw(prov.token)
    svc = prov.post("/v1/services", {"name": "api", "load_balancer_id": lb["id"], "allowed_tenants": []})
    nobody = "00000000-0000-4000-8000-000000000000"
    for ids in ([nobody], [cons.tenant_id]):
        r = raw.patch(f"/v1/services/{svc['id']}", json={"allowed_tenants": ids})
        assert r.status_code == 200 and r.json()["allowed_tenants"] == ids, r.text
    r = raw.patch(f"/v1/services/{svc['id']}", json={"allowed_tenants": [cons.tenant_id, cons.tenant_id]})
    assert r.status_code == 422 and r.json()["field"] == "allowed_tenants", r.text
    assert prov.get(f"/v1/services/{svc['id']}")["allowed_tenants"] == [cons.tenant_id]
    ep = cons.post("/v1/service-endpoints", {"vpc_id": cvpc["id"], "subnet_id": csn["id"],
                                             "service_id": svc["id"]})
    theirs = [p for p in prov.get("/v1/ports") if p["name"].startswith("consumer-")]
    assert [p["name"] for p in theirs] == [f"consumer-{ep['id']}"]
    assert "very-secret-project" not in str(prov.get("/v1/ports"))


def test_the_cli_deletes_a_pool_by_its_cidr_and_rebalances_a_line(ops: Controller) -> None:
    from typer.testing import CliRunner

    from tianjictl.main import _register_components, app

    _register_components()

    def tianji(token: str, *args: str) -> tuple[int, str]:
        r = CliRunner().invoke(app, ["--url", ops.url, "--token", token, *args], env={"COLUMNS": "200"})
        return r.exit_code, r.output

    adm = ops.admin_token
    assert tianji(adm, "eip-pool", "create", "198.51.100.0/24")[0] == 0
    code, out = tianji(adm, "eip-pool", "delete", "198.51.100.0/24")
    assert code == 0 and "deleted EIP pool" in out, out
    assert tianji(adm, "eip-pool", "delete", "198.51.100.0/24")[0] == 3  # not found
    t = ops.tenant()
    vpc = t.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    for i in (1, 2):
        ops.admin.post("/v1/hosts", {"name": f"pl{i}", "vtep_ip": f"192.0.2.{i}", "kind": "gateway",
                                     "role": "private-line"})
    line = t.post("/v1/private-lines", {"name": "dc", "vpc_id": vpc["id"], "vlan_id": 100, "customer_asn": 65001,
                                        "customer_ip": "169.254.0.2/30", "local_ip": "169.254.0.1/30"})
    code, out = tianji(adm, "--json", "private-line", "rebalance", line["id"])
    assert code == 0 and json.loads(out)["sessions"][0]["instance"] in ("pl1", "pl2"), out
    assert tianji(t.token, "private-line", "rebalance", line["id"])[0] == 5  # the operator's
