"""The `tianji` command against a served controller: a tenant's network made and read back with the CLI, tables by
default and JSON with --json, and an API error shown as one line naming the field, with a non-zero exit."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.support.controller import Controller
from tianjictl.main import _register_components, app

_register_components()
runner = CliRunner()


def tianji(controller: Controller, token: str, *args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["--url", controller.url, "--token", token, *args], env={"COLUMNS": "200"})
    return r.exit_code, r.output


def test_a_tenant_builds_its_network_with_the_cli(controller: Controller) -> None:
    code, out = tianji(controller, controller.admin_token, "--json", "tenant", "create", "acme")
    assert code == 0, out
    token = json.loads(out)["token"]
    code, out = tianji(controller, token, "--json", "vpc", "create", "prod", "--cidr", "10.8.0.0/16")
    assert code == 0, out
    vpc = json.loads(out)
    code, out = tianji(controller, token, "subnet", "create", "web", "--vpc", vpc["id"], "--cidr", "10.8.1.0/24")
    assert code == 0 and "10.8.1.0/24" in out, out
    code, out = tianji(controller, token, "vpc", "list")
    assert code == 0 and "prod" in out and "10.8.0.0/16" in out, out  # a table
    code, out = tianji(controller, token, "vpc", "create", "bad", "--cidr", "10.8.0.0/99")
    assert code != 0 and "error" in out and "cidr" in out, out
    assert tianji(controller, controller.admin_token, "tenant", "create", "other")[0] == 0
    code, out = tianji(controller, token, "tenant", "list")
    assert code == 0 and "acme" in out and "other" not in out, out  # a tenant sees itself only


def test_a_tenant_puts_a_load_balancer_in_front_of_vms_with_the_cli(controller: Controller) -> None:
    t = controller.tenant()
    token = t.http.headers["Authorization"].split()[1]
    vpc = t.post("/v1/vpcs", {"name": "v", "cidr": "10.8.0.0/16"})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.8.1.0/24"})
    backends = [t.post("/v1/ports", {"subnet_id": sn["id"], "name": f"b{i}"}) for i in range(2)]
    code, out = tianji(controller, token, "--json", "lb", "create", "web", "--vpc", vpc["id"], "--subnet", sn["id"])
    assert code == 0, out
    lb = json.loads(out)
    code, out = tianji(controller, token, "--json", "lb", "pool-create", lb["id"], "--name", "p", "--protocol", "tcp")
    assert code == 0, out
    pool = json.loads(out)
    assert tianji(controller, token, "lb", "listener-create", lb["id"], "--protocol", "tcp", "--port", "80",
                  "--pool", pool["id"])[0] == 0
    for i, b in enumerate(backends):
        code, out = tianji(controller, token, "lb", "member-add", pool["id"], "--port", b["id"], "--protocol-port",
                           "8080", "--weight", str(i + 1))
        assert code == 0, out
    assert tianji(controller, token, "lb", "monitor-set", pool["id"], "--type", "tcp")[0] == 0
    code, out = tianji(controller, token, "lb", "members", pool["id"])
    assert code == 0 and "OFFLINE" in out and backends[1]["ip"] in out and "pool p: OFFLINE" in out, out
    code, out = tianji(controller, token, "lb", "pool-create", lb["id"], "--name", "q", "--protocol", "tcp",
                       "--table-size", "65536")
    assert code != 0 and "--table-size:" in out and "prime" in out, out
    code, out = tianji(controller, token, "lb", "list")
    assert code == 0 and "web" in out and lb["vip_address"] in out, out


def test_a_tenant_orders_a_private_line_with_the_cli(controller: Controller) -> None:
    t = controller.tenant()
    token = t.http.headers["Authorization"].split()[1]
    vpc = t.post("/v1/vpcs", {"name": "v", "cidr": "10.8.0.0/16"})
    code, out = tianji(controller, token, "--json", "private-line", "create", "dc1", "--vpc", vpc["id"], "--vlan",
                       "300", "--customer-asn", "65010", "--customer-ip", "169.254.30.2/30", "--local-ip",
                       "169.254.30.1/30", "--md5-password", "k3y", "--static-route", "192.168.40.0/24")
    assert code == 0, out
    line = json.loads(out)
    assert line["md5"] is True and line["static_routes"] == ["192.168.40.0/24"]
    code, out = tianji(controller, token, "private-line", "show", line["id"])
    assert code == 0 and "sessions" in out and "Idle" in out and "10.8.0.0/16" in out, out
    code, out = tianji(controller, token, "private-line", "create", "dc2", "--vpc", vpc["id"], "--vlan", "300",
                       "--customer-asn", "65010", "--customer-ip", "169.254.31.2/30", "--local-ip",
                       "169.254.31.1/30")
    assert code != 0 and "--vlan:" in out and "already used" in out, out
    code, out = tianji(controller, token, "private-line", "create", "dc3", "--vpc", vpc["id"], "--vlan", "301",
                       "--customer-asn", "23456", "--customer-ip", "169.254.32.2/30", "--local-ip",
                       "169.254.32.1/30")
    assert code != 0 and "--customer-asn:" in out and "AS_TRANS" in out, out
    assert tianji(controller, token, "private-line", "delete", line["id"])[0] == 0


def test_the_operator_shares_a_service_and_a_tenant_makes_an_endpoint_with_the_cli(controller: Controller) -> None:
    admin = controller.admin_token
    code, out = tianji(controller, admin, "--json", "service", "create", "store", "--address", "100.100.0.10",
                       "--port", "tcp/80", "--port", "tcp/443")
    assert code == 0, out
    svc = json.loads(out)
    assert svc["ports"] == [{"protocol": "tcp", "port": 80}, {"protocol": "tcp", "port": 443}]
    code, out = tianji(controller, admin, "service", "create", "bad", "--address", "100.100.0.11", "--port", "80")
    assert code != 0 and "tcp/443" in out, out
    token = controller.admin.post("/v1/tenants", {"name": "acme"})["token"]
    code, out = tianji(controller, token, "--json", "vpc", "create", "prod", "--cidr", "10.8.0.0/16")
    vpc = json.loads(out)
    code, out = tianji(controller, token, "--json", "subnet", "create", "s", "--vpc", vpc["id"], "--cidr",
                       "10.8.1.0/24")
    sn = json.loads(out)
    code, out = tianji(controller, token, "service", "list")
    assert code == 0 and "store" in out and "100.100.0.10" not in out, out  # tenants see name and ports
    code, out = tianji(controller, token, "--json", "endpoint", "create", "--service", svc["id"], "--vpc", vpc["id"],
                       "--subnet", sn["id"])
    assert code == 0, out
    ep = json.loads(out)
    assert ep["dns_name"] == "store.prod.internal" and ep["address"].startswith("10.8.1.")
    code, out = tianji(controller, token, "endpoint", "create", "--service", svc["id"], "--vpc", vpc["id"],
                       "--subnet", sn["id"])
    assert code != 0 and "--service:" in out and "one per service and VPC" in out, out
    assert tianji(controller, token, "endpoint", "delete", ep["id"])[0] == 0
    assert tianji(controller, admin, "service", "delete", svc["id"])[0] == 0


def test_ipv6_addresses_come_out_as_written_never_as_emoji(controller: Controller) -> None:
    """`fd00:7469:0:100::/56` holds ":100:", rich's emoji code for a hundred-points sign."""
    code, out = tianji(controller, controller.admin_token, "--json", "tenant", "create", "v6")
    token = json.loads(out)["token"]
    for name in ("d1", "d2"):  # the second /56 of the pool is fd00:7469:0:100::/56
        code, out = tianji(controller, token, "--json", "vpc", "create", name, "--cidr", "10.8.0.0/16",
                           "--ipv6-cidr", "auto")
        assert code == 0, out
    assert json.loads(out)["ipv6_cidr"] == "fd00:7469:0:100::/56", out
    code, out = tianji(controller, token, "vpc", "list")
    assert code == 0 and "fd00:7469:0:100::/56" in out and "\U0001f4af" not in out, out  # a table too
