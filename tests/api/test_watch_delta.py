"""The delta watch (`/v1/hosts/{name}/config/delta`): applied to the config an agent holds, every delta gives
exactly the whole config the controller compiles at that revision, whatever the writes in between."""

from __future__ import annotations

import json
import random
import time

from sqlalchemy import update

from controller.state import models as m
from tests.conftest import Controller
from tianji.host_delta import apply_delta
from tianji.southbound import HostConfig, HostConfigDelta

HOSTS = ["hv1", "hv2", "hv3"]


def test_delta_follows_random_writes(controller: Controller) -> None:
    rng = random.Random(7)
    adm = controller.admin
    for i, h in enumerate(HOSTS):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
    t = controller.tenant()
    vpcs, subnets = [], []
    for v in range(3):
        vpc = t.post("/v1/vpcs", {"name": f"v{v}", "cidr": f"10.{v}.0.0/16"})
        vpcs.append(vpc)
        subnets.append(t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": f"10.{v}.0.0/24"}))
    other = controller.tenant()  # another tenant's writes must not show in these hosts' configs
    ovpc = other.post("/v1/vpcs", {"name": "o", "cidr": "10.0.0.0/16"})
    osn = other.post("/v1/subnets", {"vpc_id": ovpc["id"], "name": "s", "cidr": "10.0.0.0/24"})
    held: dict[str, HostConfig | None] = dict.fromkeys(HOSTS)
    ports: list[dict] = []
    peerings: list[dict] = []
    groups: list[dict] = []
    sizes = {"whole": 0, "delta": 0}

    def sync(h: str) -> None:
        cur = held[h]
        after = cur.revision if cur else -1
        body = adm.get(f"/v1/hosts/{h}/config/delta", after=after)
        if body is None:  # nothing changed for this host
            assert cur is not None and HostConfig.model_validate(adm.get(f"/v1/hosts/{h}/config")) == cur
            return
        d = HostConfigDelta.model_validate(body)
        assert d.base == after
        new = apply_delta(cur, d)
        assert new is not None, f"delta {d.base} -> {d.revision} did not apply"
        whole = HostConfig.model_validate(adm.get(f"/v1/hosts/{h}/config"))
        assert new == whole
        sizes["whole"] += len(whole.model_dump_json())
        sizes["delta"] += len(d.model_dump_json())
        held[h] = new

    for h in HOSTS:
        sync(h)
    for step in range(60):
        op = rng.choice(["port", "port", "port", "other", "delete", "move", "peer", "unpeer", "sg", "host"])
        if op == "port" or not ports:
            k = rng.randrange(3)
            ports.append(controller.orchestrator().post("/v1/ports", {"subnet_id": subnets[k]["id"],
                                                                      "name": f"p{step}", "host": rng.choice(HOSTS)}))
        elif op == "other":
            controller.orchestrator().post("/v1/ports", {"subnet_id": osn["id"], "name": f"o{step}",
                                                         "host": rng.choice(HOSTS)})
        elif op == "delete":
            t.delete(f"/v1/ports/{ports.pop(rng.randrange(len(ports)))['id']}")
        elif op == "move":
            p = rng.choice(ports)
            p.update(controller.orchestrator().patch(f"/v1/ports/{p['id']}", {"host": rng.choice([*HOSTS, None])}))
        elif op == "peer" and not peerings:
            a, b = rng.sample(range(3), 2)
            peerings.append(t.post("/v1/peerings", {"requester_vpc_id": vpcs[a]["id"],
                                                    "accepter_vpc_id": vpcs[b]["id"]}))
        elif op == "unpeer" and peerings:
            t.delete(f"/v1/peerings/{peerings.pop()['id']}")
        elif op == "sg":
            p = rng.choice(ports)
            if not groups or rng.random() < 0.3:
                groups.append(t.post("/v1/security-groups", {"vpc_id": p["vpc_id"], "name": f"g{step}", "rules": [
                    {"direction": "ingress", "protocol": "tcp", "port_range_min": 22, "port_range_max": 22,
                     "remote_cidr": "0.0.0.0/0"}]}))
            mine = [g["id"] for g in groups if g["vpc_id"] == p["vpc_id"]]
            t.patch(f"/v1/ports/{p['id']}", {"security_group_ids": rng.sample(mine, rng.randint(0, len(mine)))})
        elif op == "host":  # a VTEP moves: the topology changes, every section is resent
            i = rng.randrange(3)
            adm.post("/v1/hosts", {"name": HOSTS[i], "vtep_ip": f"172.31.{step}.{i + 1}"})
        for h in rng.sample(HOSTS, rng.randint(1, 3)):  # agents fall behind by one or several writes
            sync(h)
    for h in HOSTS:
        sync(h)
    assert sizes["delta"] < sizes["whole"], sizes


def test_delta_that_does_not_fit_is_refused_by_the_agent_side(controller: Controller) -> None:
    adm = controller.admin
    adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    t = controller.tenant()
    vpc = t.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.0.0/24"})
    controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
    far = t.post("/v1/vpcs", {"name": "far", "cidr": "10.9.0.0/16"})
    fsn = t.post("/v1/subnets", {"vpc_id": far["id"], "name": "s", "cidr": "10.9.0.0/24"})
    controller.orchestrator().post("/v1/ports", {"subnet_id": fsn["id"], "name": "f", "host": "hv1"})
    whole = HostConfigDelta.model_validate(adm.get("/v1/hosts/hv1/config/delta"))
    assert whole.base == -1 and whole.ports and whole.vteps
    cfg = apply_delta(None, whole)
    assert cfg == HostConfig.model_validate(adm.get("/v1/hosts/hv1/config"))
    controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "b", "host": "hv1"})
    d = HostConfigDelta.model_validate(adm.get("/v1/hosts/hv1/config/delta", after=cfg.revision))
    # only the VPC that changed: its endpoints, groups and this host's ports, not the other VPC's
    assert d.changed_vpcs == [vpc["id"]] and d.vteps is None
    assert {p.vpc_id for p in d.ports} == {vpc["id"]} and len(d.ports) == 2
    assert {e.vpc_id for e in d.endpoints} == {vpc["id"]} and len(d.endpoints) == 2
    assert {g.vpc_id for g in d.security_groups} == {vpc["id"]}
    assert apply_delta(cfg, d) == HostConfig.model_validate(adm.get("/v1/hosts/hv1/config"))
    assert apply_delta(None, d) is None  # nothing held: needs a whole config
    stale = cfg.model_copy(update={"revision": cfg.revision - 1})
    assert apply_delta(stale, d) is None  # another base
    # a delta naming a VPC the agent holds nothing for
    assert apply_delta(cfg.model_copy(update={"vpcs": []}), d.model_copy(update={"changed_vpcs": [], "vpcs": []})) \
        is None
    # and the 304 when nothing changed
    assert adm.get("/v1/hosts/hv1/config/delta", after=d.revision, timeout=0.2) is None


def test_topology_events_cost_other_hosts_an_entry(controller: Controller) -> None:
    """With form=objects a hypervisor joining, moving its VTEP or leaving sends every other host that VTEP entry
    (under a kilobyte), never its whole config; a hypervisor going down and up sends nobody anything."""
    adm = controller.admin
    for i, h in enumerate(HOSTS):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
    t = controller.tenant()
    for v in range(3):
        vpc = t.post("/v1/vpcs", {"name": f"v{v}", "cidr": f"10.{v}.0.0/16"})
        sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": f"10.{v}.0.0/24"})
        controller.orchestrator().post("/v1/ports/bulk", {"ports": [
            {"subnet_id": sn["id"], "name": f"p{j}", "host": HOSTS[j % 3]} for j in range(30)]})
    held = {h: apply_delta(None, HostConfigDelta.model_validate(adm.get(f"/v1/hosts/{h}/config/delta",
                                                                         form="objects"))) for h in HOSTS}

    def deltas() -> dict[str, HostConfigDelta | None]:
        out = {}
        for h in HOSTS:
            body = adm.get(f"/v1/hosts/{h}/config/delta", after=held[h].revision, form="objects", timeout=0.1)
            out[h] = None if body is None else HostConfigDelta.model_validate(body)
            if out[h] is not None:
                assert len(json.dumps(body)) < 1024, body
                held[h] = apply_delta(held[h], out[h])
                assert held[h] == HostConfig.model_validate(adm.get(f"/v1/hosts/{h}/config"))
        return out

    adm.post("/v1/hosts", {"name": "joiner", "vtep_ip": "172.31.9.9"})
    for d in deltas().values():
        assert d is not None and d.changed_vpcs == [] and d.vteps is None and not d.ports and not d.endpoints
        assert [v.host for v in d.vtep_updates] == ["joiner"] and d.vteps_removed == []
    adm.patch("/v1/hosts/joiner", {"vtep_ip": "172.31.9.10"})
    assert all(d is not None and [v.ip for v in d.vtep_updates] == ["172.31.9.10"] for d in deltas().values())
    adm.delete("/v1/hosts/joiner")
    assert all(d is not None and d.vteps_removed == ["joiner"] and not d.vtep_updates for d in deltas().values())
    assert all("joiner" not in {v.host for v in cfg.vteps} for cfg in held.values())

    from controller.southbound.liveness import mark_silent_hosts_down
    for _ in range(10):  # hv3 silent: down, then back (a beat the app flushes meanwhile makes it live again: retry)
        with controller.db.write() as w:
            w.session.execute(update(m.Host.__table__).where(m.Host.__table__.c.name == "hv3")
                              .values(last_seen=m.now().replace(year=2000)))
        if (downed := mark_silent_hosts_down(controller.db, 60)) == ["hv3"]:
            break
        time.sleep(0.2)
    assert downed == ["hv3"]
    controller.raw(controller.admin_token).post("/v1/hosts/hv3/status", json={"ports": {}})
    assert adm.get("/v1/hosts/hv3")["status"] == "up"
    assert deltas() == dict.fromkeys(HOSTS)


def test_an_entries_only_delta_holds_the_entries_up_to_its_claim(controller: Controller) -> None:
    """A stream told of joins claims only the revisions the commit order confirmed (controller/api/host_stream.py);
    the entries of newer ones come with its next delta, not with this one as well (sent twice, a mass join cost
    SQLite's streams 719 bytes per host instead of 360)."""
    from controller.southbound.host_deltas import Asked, compile_host_deltas
    from controller.southbound.patches import Sent

    adm = controller.admin
    adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    adm.post("/v1/hosts", {"name": "c", "vtep_ip": "172.31.0.4"})
    base = adm.get("/v1/hosts/hv1/config")["revision"]
    adm.post("/v1/hosts", {"name": "a", "vtep_ip": "172.31.0.2"})
    claim = adm.get("/v1/hosts/hv1/config")["revision"]
    adm.post("/v1/hosts", {"name": "b", "vtep_ip": "172.31.0.3"})
    adm.delete("/v1/hosts/c")
    sent = Sent(vtep_ip="172.31.0.1")
    with controller.db.snapshot() as s:
        first, later = compile_host_deltas(s, [Asked("hv1", base, "objects", sent, vteps_only=claim),
                                               Asked("hv1", claim, "objects", sent, vteps_only=claim + 2)])
    assert first.revision == claim and [v.host for v in first.vtep_updates] == ["a"] and first.vteps_removed == []
    assert [v.host for v in later.vtep_updates] == ["b"] and later.vteps_removed == ["c"]
