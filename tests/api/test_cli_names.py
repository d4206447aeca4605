"""`tianji` tables name what they reference: a port's security groups, a subnet's VPC, a peering's VPCs, a NAT
gateway's EIPs (by address), the admin's tenant column; the ids with `--long`, `-c` and `-o json`. The other side
of a peering with another tenant keeps its id (a name is never learnt through a reference); a tenant's tables have
no tenant column."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.support.controller import Controller
from tianjictl.main import _register_components, app

_register_components()
runner = CliRunner()


def tianji(controller: Controller, token: str, *args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["--url", controller.url, "--token", token, *args], env={"COLUMNS": "250"})
    return r.exit_code, r.output


def header(out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if "┃" in ln)
    return [c.strip() for c in line.strip("┃ ").split("┃")]


def test_tables_show_names_and_ids_on_request(controller: Controller) -> None:
    t = controller.tenant("names-acme")
    token = t.http.headers["Authorization"].split()[1]
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.8.0.0/16"})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "web", "cidr": "10.8.1.0/24"})
    sg = t.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "frontends"})
    port = t.post("/v1/ports", {"subnet_id": sn["id"], "name": "p1", "security_group_ids": [sg["id"]]})

    code, out = tianji(controller, token, "port", "list")
    assert code == 0, out
    assert "security_groups" in header(out) and "frontends" in out and sg["id"] not in out, out
    code, out = tianji(controller, token, "subnet", "list")
    assert "vpc" in header(out) and "prod" in out and vpc["id"] not in out, out
    code, out = tianji(controller, token, "vpc", "list")
    assert "tenant" not in header(out) and "tenant_id" not in header(out), out  # all its own

    code, out = tianji(controller, token, "port", "list", "--long")
    assert "security_group_ids" in header(out) and sg["id"] in out and "frontends" not in out, out
    code, out = tianji(controller, token, "port", "list", "-c", "security_group_ids")
    assert sg["id"] in out, out
    code, out = tianji(controller, token, "port", "list", "-o", "json")
    assert json.loads(out)[0]["security_group_ids"] == [sg["id"]], out
    assert port["id"] in out


def test_the_admin_sees_tenants_by_name_and_a_peer_keeps_its_id(controller: Controller) -> None:
    a, b = controller.tenant("names-alpha"), controller.tenant("names-beta")
    va = a.post("/v1/vpcs", {"name": "alpha-vpc", "cidr": "10.20.0.0/16"})
    vb = b.post("/v1/vpcs", {"name": "beta-secret", "cidr": "10.21.0.0/16"})
    a.post("/v1/peerings", {"requester_vpc_id": va["id"], "accepter_vpc_id": vb["id"]})

    code, out = tianji(controller, controller.admin_token, "vpc", "list")
    assert code == 0 and "tenant" in header(out), out
    assert "names-alpha" in out and "names-beta" in out and a.tenant_id not in out, out

    token_a = a.http.headers["Authorization"].split()[1]
    code, out = tianji(controller, token_a, "peering", "list")
    assert code == 0 and header(out)[:3] == ["id", "requester_vpc", "accepter_vpc"], out
    assert "alpha-vpc" in out and vb["id"] in out and "beta-secret" not in out, out


def test_a_nat_gateways_eips_by_address(controller: Controller) -> None:
    controller.admin.post("/v1/eip-pools", {"cidr": "198.51.100.0/28"})
    t = controller.tenant("names-nat")
    token = t.http.headers["Authorization"].split()[1]
    vpc = t.post("/v1/vpcs", {"name": "v", "cidr": "10.30.0.0/16"})
    eip = t.post("/v1/eips", {})
    t.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]], "name": "gw"})
    code, out = tianji(controller, token, "nat-gateway", "list")
    assert code == 0 and "eips" in header(out) and eip["address"] in out and eip["id"] not in out, out


def test_resource_names_complete_in_the_shell(controller: Controller, tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    t = controller.tenant("names-comp")
    token = t.http.headers["Authorization"].split()[1]
    for name, cidr in (("prod", "10.8.0.0/16"), ("preprod", "10.9.0.0/16"), ("dev", "10.10.0.0/16")):
        t.post("/v1/vpcs", {"name": name, "cidr": cidr})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIANJI_")} | {
        "_TIANJI_COMPLETE": "complete_bash", "TIANJI_URL": controller.url, "TIANJI_TOKEN": token,
        "HOME": str(tmp_path)}
    tianji = str(Path(sys.executable).with_name("tianji"))

    def complete(words: str) -> list[str]:
        cword = str(len(words.split()) - (0 if words.endswith(" ") else 1))
        r = subprocess.run([tianji], env=env | {"COMP_WORDS": words, "COMP_CWORD": cword}, capture_output=True,
                           text=True, timeout=30)
        return r.stdout.split()

    assert complete("tianji subnet create x --vpc pr") == ["preprod", "prod"]  # an option's names
    assert complete("tianji vpc show ") == ["dev", "preprod", "prod"]  # an argument's
    assert complete("tianji vpc show zz") == []
