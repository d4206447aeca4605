"""The `tianji` command against a served controller: a tenant's network made and read back with the CLI, tables by
default and JSON with --json, and an API error shown as one line naming the field, with a non-zero exit."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.support.controller import Controller
from tianji.cli import _register_components, app

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
