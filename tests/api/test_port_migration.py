"""A port's live migration through the API (both backends): `migrating_to` binds it on the destination too, the
destination's config holds it as a local port and every other host's endpoint for it names both VTEPs; `host` set
to the destination ends it, `migrating_to: null` abandons it. Only the admin and orchestrators may do either; bad
input is a 4xx naming the field and changes nothing."""

from __future__ import annotations

from tests.conftest import Controller


def _setup(c: Controller) -> tuple:
    adm = c.admin
    for i, h in enumerate(("hv1", "hv2", "hv3"), start=11):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"192.0.2.{i}"})
    t = c.tenant("acme")
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    port = t.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm"})
    other = t.post("/v1/ports", {"subnet_id": sn["id"], "name": "other"})
    c.orchestrator().patch(f"/v1/ports/{other['id']}", {"host": "hv3"})
    return t, port, other


def _local(c: Controller, host: str, port_id: str) -> bool:
    return any(p["id"] == port_id for p in c.admin.get(f"/v1/hosts/{host}/config")["ports"])


def _endpoint(c: Controller, host: str, port_id: str) -> dict:
    return next(e for e in c.admin.get(f"/v1/hosts/{host}/config")["endpoints"] if e["port_id"] == port_id)


def test_a_migration_binds_both_hosts_until_it_ends(controller: Controller) -> None:
    c = controller
    t, port, _ = _setup(c)
    orch, raw = c.orchestrator(), c.raw(c.orchestrator().token)
    r = raw.patch(f"/v1/ports/{port['id']}", json={"migrating_to": "hv2"})
    assert r.status_code == 409 and r.json()["field"] == "migrating_to" and "not bound" in r.json()["detail"]
    orch.patch(f"/v1/ports/{port['id']}", {"host": "hv1"})
    for body, code in (({"migrating_to": "hv1"}, 422), ({"migrating_to": "nowhere"}, 422)):
        r = raw.patch(f"/v1/ports/{port['id']}", json=body)
        assert r.status_code == code and r.json()["field"] == "migrating_to", r.json()
    r = c.raw(t.token).patch(f"/v1/ports/{port['id']}", json={"migrating_to": "hv2"})
    assert r.status_code == 403 and "orchestrator" in r.json()["detail"]  # a tenant never binds
    assert t.get(f"/v1/ports/{port['id']}")["migrating_to"] is None  # nothing changed

    out = orch.patch(f"/v1/ports/{port['id']}", {"migrating_to": "hv2"})
    assert (out["host"], out["migrating_to"]) == ("hv1", "hv2")
    assert _local(c, "hv1", port["id"]) and _local(c, "hv2", port["id"])
    e = _endpoint(c, "hv3", port["id"])
    assert (e["host"], e["vtep_ip"], e["also_host"], e["also_vtep_ip"]) == ("hv1", "192.0.2.11", "hv2", "192.0.2.12")
    r = c.raw(c.admin_token).delete("/v1/hosts/hv2")
    assert r.status_code == 409 and "migrating to host hv2" in r.json()["detail"]

    out = orch.patch(f"/v1/ports/{port['id']}", {"host": "hv2"})  # the guest runs there: the migration ends
    assert (out["host"], out["migrating_to"]) == ("hv2", None)
    assert not _local(c, "hv1", port["id"]) and _local(c, "hv2", port["id"])
    e = _endpoint(c, "hv3", port["id"])
    assert (e["host"], e["vtep_ip"], e.get("also_host")) == ("hv2", "192.0.2.12", None)


def test_an_abandoned_migration_leaves_the_port_where_it_was(controller: Controller) -> None:
    c = controller
    _, port, _ = _setup(c)
    orch = c.orchestrator()
    orch.patch(f"/v1/ports/{port['id']}", {"host": "hv1"})
    orch.patch(f"/v1/ports/{port['id']}", {"migrating_to": "hv2"})
    out = orch.patch(f"/v1/ports/{port['id']}", {"migrating_to": None})
    assert (out["host"], out["migrating_to"]) == ("hv1", None)
    assert _local(c, "hv1", port["id"]) and not _local(c, "hv2", port["id"])
    assert _endpoint(c, "hv3", port["id"]).get("also_host") is None
    r = c.raw(orch.token).patch(f"/v1/ports/{port['id']}", json={"name": "renamed"})
    assert r.status_code == 403 and r.json()["field"] == "name"  # an orchestrator binds, nothing more


def test_an_orchestrator_reads_one_subnet_and_vpc_to_wire_a_guest_and_nothing_more(controller: Controller) -> None:
    """A CNI plugin or Nova wires an interface with the subnet's prefix and gateway and the VPC's MTU: an
    orchestrator token reads those, one at a time; it lists nothing and changes nothing of them; a host reads none."""
    c = controller
    t, port, _ = _setup(c)
    raw = c.raw(c.orchestrator().token)
    sn = raw.get(f"/v1/subnets/{port['subnet_id']}")
    vpc = raw.get(f"/v1/vpcs/{port['vpc_id']}")
    assert sn.status_code == 200 and sn.json()["gateway_ip"] == "10.0.1.1"
    assert vpc.status_code == 200 and vpc.json()["mtu"] == 1450
    for r in (raw.get("/v1/subnets"), raw.get("/v1/vpcs"), raw.delete(f"/v1/subnets/{port['subnet_id']}"),
              raw.patch(f"/v1/vpcs/{port['vpc_id']}", json={"name": "x"})):
        assert r.status_code == 403, r.text
    host = c.raw(c.host_token("hv1"))
    assert host.get(f"/v1/subnets/{port['subnet_id']}").status_code == 403
    assert t.get(f"/v1/vpcs/{port['vpc_id']}")["name"] == "prod"


def test_the_cli_starts_ends_and_abandons_a_migration(controller: Controller) -> None:
    from tests.api.test_cli import tianji

    c = controller
    _, port, _ = _setup(c)
    orch = c.orchestrator().token
    assert tianji(c, orch, "port", "bind", port["id"], "hv1")[0] == 0
    rc, out = tianji(c, orch, "port", "migrate", port["id"])
    assert rc != 0 and "--to HOST" in out
    rc, out = tianji(c, orch, "port", "migrate", port["id"], "--to", "hv2")
    assert rc == 0 and "hv2" in out, out
    assert c.admin.get(f"/v1/ports/{port['id']}")["migrating_to"] == "hv2"
    assert tianji(c, orch, "port", "migrate", port["id"], "--abandon")[0] == 0
    assert c.admin.get(f"/v1/ports/{port['id']}")["migrating_to"] is None
    tianji(c, orch, "port", "migrate", port["id"], "--to", "hv2")
    assert tianji(c, orch, "port", "bind", port["id"], "hv2")[0] == 0  # the guest runs there: done
    got = c.admin.get(f"/v1/ports/{port['id']}")
    assert (got["host"], got["migrating_to"]) == ("hv2", None)
