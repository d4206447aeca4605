"""The host watch API and allocation under concurrency."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import Controller
from tianji.api_client import Client
from tianji.southbound import HostConfig


def setup_tenant(c: Controller, cidr: str = "10.0.0.0/16"):
    t = c.tenant()
    vpc = t.post("/v1/vpcs", {"name": "v", "cidr": cidr})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": cidr.replace("/16", "/24")})
    return t, vpc, sn


def test_host_config_contents(controller: Controller) -> None:
    adm = controller.admin
    adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    adm.post("/v1/hosts", {"name": "hv2", "vtep_ip": "172.31.0.2"})
    t, vpc, sn = setup_tenant(controller)
    p1 = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
    p2 = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "b", "host": "hv2"})
    peer = t.post("/v1/vpcs", {"name": "peer", "cidr": "10.7.0.0/16"})
    psn = t.post("/v1/subnets", {"vpc_id": peer["id"], "name": "s", "cidr": "10.7.0.0/24"})
    p3 = controller.orchestrator().post("/v1/ports", {"subnet_id": psn["id"], "name": "c", "host": "hv2"})
    unrelated = t.post("/v1/vpcs", {"name": "far", "cidr": "10.8.0.0/16"})
    usn = t.post("/v1/subnets", {"vpc_id": unrelated["id"], "name": "s", "cidr": "10.8.0.0/24"})
    controller.orchestrator().post("/v1/ports", {"subnet_id": usn["id"], "name": "d", "host": "hv2"})
    pc = t.post("/v1/peerings", {"requester_vpc_id": vpc["id"], "accepter_vpc_id": peer["id"]})
    cfg = HostConfig.model_validate(adm.get("/v1/hosts/hv1/config"))
    assert [p.id for p in cfg.ports] == [p1["id"]]
    assert {v.id for v in cfg.vpcs} == {vpc["id"], peer["id"]}
    assert {e.port_id: e.vtep_ip for e in cfg.endpoints} == {p1["id"]: "172.31.0.1", p2["id"]: "172.31.0.2",
                                                             p3["id"]: "172.31.0.2"}
    own = next(v for v in cfg.vpcs if v.id == vpc["id"])
    assert {(r.destination, r.target_type, r.peer_vpc_id) for r in own.routes} == {
        ("10.0.0.0/16", "local", None), ("10.7.0.0/16", "peering", peer["id"])}
    assert own.subnets[0].gateway_ip == "10.0.0.1"
    assert {v.ip for v in cfg.vteps} == {"172.31.0.1", "172.31.0.2"}
    (sg,) = cfg.security_groups
    ingress = next(r for r in sg.rules if r.direction == "ingress")
    assert set(ingress.remote_cidrs) == {"10.0.0.2/32", "10.0.0.3/32"}  # remote group resolved to members
    t.delete(f"/v1/peerings/{pc['id']}")
    cfg2 = HostConfig.model_validate(adm.get("/v1/hosts/hv1/config"))
    assert cfg2.revision > cfg.revision
    assert {v.id for v in cfg2.vpcs} == {vpc["id"]}
    assert p3["id"] not in {e.port_id for e in cfg2.endpoints}


def test_watch_wakes_on_write_and_ignores_other_tenants(controller: Controller) -> None:
    adm = controller.admin
    adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    t, vpc, sn = setup_tenant(controller)
    controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
    cfg = adm.get("/v1/hosts/hv1/config")
    rev = cfg["revision"]
    # no change: a 304 after the timeout
    started = time.monotonic()
    assert adm.get("/v1/hosts/hv1/config", after=rev, timeout=0.5) is None
    assert time.monotonic() - started >= 0.45
    # another tenant's writes do not change hv1's config
    other, ovpc, osn = setup_tenant(controller)
    other.post("/v1/ports", {"subnet_id": osn["id"], "name": "x"})
    assert adm.get("/v1/hosts/hv1/config", after=rev, timeout=0.5) is None
    assert adm.get("/v1/hosts/hv1/config")["revision"] == rev
    # a relevant write wakes a waiting watch within 1 s
    result: dict = {}

    def watch() -> None:
        t0 = time.monotonic()
        result["cfg"] = adm.get("/v1/hosts/hv1/config", after=rev, timeout=10)
        result["waited"] = time.monotonic() - t0

    th = threading.Thread(target=watch)
    th.start()
    time.sleep(0.5)
    written = time.monotonic()
    t.post("/v1/ports", {"subnet_id": sn["id"], "name": "b"})  # same VPC, not bound: still hv1's business
    th.join(5)
    woke_after = time.monotonic() - written
    assert result["cfg"]["revision"] > rev
    assert woke_after < 1.0, woke_after
    assert len(result["cfg"]["endpoints"]) == 1  # unbound ports are not endpoints


def test_watch_across_two_controller_processes(controller: Controller, tmp_path) -> None:
    """A second controller on the same database: a write through one wakes a watch on the other. On PostgreSQL
    the second has a state directory of its own, and accepts the admin token the first made (the database holds
    its hash): replicas need not share a directory."""
    if controller.db.engine.dialect.name == "sqlite":
        second = Controller(controller.settings.state_dir, None)
    else:
        second = Controller(tmp_path / "second", controller.settings.database_url)
        assert second.admin_token is None and not (tmp_path / "second" / "admin.token").exists()
        second.admin = Client(second.url, controller.admin_token)
    try:
        controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
        t, vpc, sn = setup_tenant(controller)
        controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
        rev = controller.admin.get("/v1/hosts/hv1/config")["revision"]
        watcher = second.admin
        out: dict = {}

        def watch() -> None:
            out["cfg"] = watcher.get("/v1/hosts/hv1/config", after=rev, timeout=10)

        th = threading.Thread(target=watch)
        th.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "b", "host": "hv1"})
        th.join(5)
        assert out["cfg"]["revision"] > rev
        assert time.monotonic() - t0 < 1.0
    finally:
        second.stop()


def test_host_marked_down_after_silence(tmp_path) -> None:
    c = Controller(tmp_path / "s", None, host_down_after=1.0)
    try:
        c.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
        c.admin.post("/v1/hosts", {"name": "hv2", "vtep_ip": "172.31.0.2"})
        t, vpc, sn = setup_tenant(c)
        p = c.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
        c.admin.post("/v1/hosts/hv1/status", {"ports": {p["id"]: "UP"}})
        assert t.get(f"/v1/ports/{p['id']}")["status"] == "UP"
        deadline = time.time() + 6
        while c.admin.get("/v1/hosts/hv1")["status"] != "down":
            assert time.time() < deadline, "host never marked down"
            c.admin.post("/v1/hosts/hv2/status", {"ports": {}})  # hv2 keeps beating (not every beat is written)
            time.sleep(0.15)
        assert c.admin.get("/v1/hosts/hv2")["status"] == "up"
        assert t.get(f"/v1/ports/{p['id']}")["status"] == "DOWN"
        c.admin.post("/v1/hosts/hv1/status", {"ports": {p["id"]: "UP"}})
        assert c.admin.get("/v1/hosts/hv1")["status"] == "up"
    finally:
        c.stop()


def test_parallel_port_creation_postgres(pg_controller: Controller) -> None:
    t, vpc, sn = setup_tenant(pg_controller)
    with ThreadPoolExecutor(50) as ex:
        ports = list(ex.map(lambda i: t.post("/v1/ports", {"subnet_id": sn["id"], "name": f"p{i}"}), range(50)))
    assert len({p["ip"] for p in ports}) == 50
    assert len({p["mac"] for p in ports}) == 50


def test_parallel_vpc_creation_postgres(pg_controller: Controller) -> None:
    tenants = [pg_controller.tenant() for _ in range(5)]
    with ThreadPoolExecutor(20) as ex:
        vpcs = list(ex.map(lambda i: tenants[i % 5].post("/v1/vpcs", {"name": f"v{i}", "cidr": "10.0.0.0/16"}),
                           range(20)))
    assert len({v["vni"] for v in vpcs}) == 20
