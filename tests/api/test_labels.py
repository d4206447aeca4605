"""Descriptions and tags on VPCs, subnets, ports and security groups; PATCH on VPCs, subnets and security groups;
lists filtered by name and tag; and none of it moves a host's config (no config reads them)."""

from __future__ import annotations

from tests.support.controller import Controller


def test_labels_patch_and_filters(controller: Controller) -> None:
    t, orch = controller.tenant(), controller.orchestrator()
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16", "description": "the shop",
                              "tags": ["env:prod", "team:ml", "env:prod"]})
    assert (vpc["description"], vpc["tags"]) == ("the shop", ["env:prod", "team:ml"])
    dev = t.post("/v1/vpcs", {"name": "dev", "cidr": "10.1.0.0/16", "tags": ["env:dev"]})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "web", "cidr": "10.0.1.0/24", "tags": ["tier:web"]})
    sg = t.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "www", "tags": ["tier:web"]})
    port = orch.post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1", "tags": ["tier:web"]})
    assert port["tags"] == ["tier:web"] and port["description"] == ""
    bulk = orch.post("/v1/ports/bulk", {"ports": [{"subnet_id": sn["id"], "name": "b", "tags": ["batch"]}]})
    assert t.get(f"/v1/ports/{bulk[0]['id']}")["tags"] == ["batch"]

    assert [v["name"] for v in t.get("/v1/vpcs", tag="env:prod")] == ["prod"]
    assert [v["name"] for v in t.get("/v1/vpcs", name="dev")] == ["dev"]
    assert {x["name"] for x in t.get("/v1/ports", tag="tier:web")} == {"a"}
    assert [x["name"] for x in t.get("/v1/subnets", tag="tier:web")] == ["web"]
    assert [x["name"] for x in t.get("/v1/security-groups", tag="tier:web")] == ["www"]
    assert t.get("/v1/vpcs", tag="env") == []  # a whole tag, not a prefix
    r = t.http.get("/v1/peerings", params={"tag": "x"})
    assert r.status_code == 422 and r.json()["field"] == "tag"

    revision = controller.snapshot()["revision"]
    configs_before = controller.admin.get("/v1/hosts/hv1/config")
    v2 = t.patch(f"/v1/vpcs/{vpc['id']}", {"description": "the shop, v2", "tags": ["env:prod"]})
    assert (v2["name"], v2["description"], v2["tags"]) == ("prod", "the shop, v2", ["env:prod"])
    t.patch(f"/v1/ports/{port['id']}", {"tags": [], "description": "web a"})
    assert controller.admin.get("/v1/hosts/hv1/config")["revision"] == configs_before["revision"], \
        "labels reach no config"
    assert controller.snapshot()["revision"] >= revision

    assert t.patch(f"/v1/vpcs/{vpc['id']}", {"name": "shop"})["name"] == "shop"
    r = t.http.patch(f"/v1/vpcs/{vpc['id']}", json={"name": "dev"})
    assert r.status_code == 409 and r.json()["field"] == "name"
    assert t.patch(f"/v1/subnets/{sn['id']}", {"name": "front", "tags": ["a", "b"]})["tags"] == ["a", "b"]
    assert t.patch(f"/v1/security-groups/{sg['id']}", {"description": "public web"})["description"] == "public web"
    r = t.http.patch(f"/v1/security-groups/{vpc['default_security_group_id']}", json={"name": "x"})
    assert r.status_code == 409
    for bad, field in (({"tags": ["a,b"]}, "tags"), ({"tags": ["x"] * 33}, "tags"), ({"description": "d" * 256},
                                                                                        "description"),
                       ({"cidr": "10.9.0.0/16"}, "cidr")):
        before = controller.snapshot()
        r = t.http.patch(f"/v1/vpcs/{dev['id']}", json=bad)
        assert r.status_code == 422 and field in r.text, (bad, r.text)
        assert controller.snapshot() == before
    other = controller.tenant()
    assert other.http.patch(f"/v1/vpcs/{dev['id']}", json={"description": "mine"}).status_code == 404
