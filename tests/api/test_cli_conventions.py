"""The command line's conventions (docs/cli.md): names wherever ids go, -o and -c on every command, errors in the
output's format with their documented exit statuses, a help line on every command, shell completion; and every
example in docs/cli.md, run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tests.conftest import free_port
from tests.support.controller import Controller
from tianjictl.main import _register_components, app

ROOT = Path(__file__).resolve().parents[2]
_register_components()


def tianji(url: str, token: str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["--url", url, "--token", token, *args], env={"COLUMNS": "200"})
    if r.exit_code == 1 and r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.output


@pytest.fixture
def acme(controller: Controller) -> tuple[Controller, str]:
    t = controller.tenant("acme")
    return controller, t.token


def test_names_work_wherever_ids_do(acme: tuple[Controller, str]) -> None:
    c, tok = acme
    run = lambda *a: tianji(c.url, tok, *a)  # noqa: E731
    assert run("vpc", "create", "prod", "--cidr", "10.0.0.0/16")[0] == 0
    assert run("subnet", "create", "web", "--vpc", "prod", "--cidr", "10.0.1.0/24")[0] == 0
    assert run("sg", "create", "www", "--vpc", "prod")[0] == 0
    code, out = run("port", "create", "a", "--subnet", "web", "--sg", "www", "-o", "json")
    assert code == 0, out
    port = json.loads(out)
    code, out = run("port", "show", "a", "-o", "value", "-c", "id", "-c", "ip")
    assert (code, out.split()) == (0, [port["id"], "10.0.1.2"])
    assert run("port", "update", "a", "--name", "b")[0] == 0
    code, out = run("port", "show", port["id"], "-o", "yaml")
    assert yaml.safe_load(out)["name"] == "b"
    assert run("vpc", "update", "prod", "--tag", "env:prod", "--description", "the shop")[0] == 0
    assert run("vpc", "list", "--tag", "env:prod", "-o", "value", "-c", "name") == (0, "prod\n")
    assert run("port", "update", "b", "--tag", "web", "-o", "value", "-c", "tags") == (0, "web\n")
    # a name two resources share is refused, naming the option and listing the candidates with their ids
    run("vpc", "create", "dev", "--cidr", "10.1.0.0/16")
    web2 = json.loads(run("subnet", "create", "web", "--vpc", "dev", "--cidr", "10.1.1.0/24", "-o", "json")[1])
    code, out = run("port", "create", "c", "--subnet", "web")
    assert code == 2 and "--subnet: 2 subnets are named 'web': " in out and web2["id"] in out, out
    assert "(10.1.1.0/24)" in out and "(10.0.1.0/24)" in out and "give one's id" in out, out


def test_exit_statuses_and_errors_in_the_outputs_format(acme: tuple[Controller, str]) -> None:
    c, tok = acme
    run = lambda *a: tianji(c.url, tok, *a)  # noqa: E731
    assert run("vpc", "create", "prod", "--cidr", "10.0.0.0/16")[0] == 0
    assert run("vpc", "show", "nosuch")[0] == 3
    code, out = run("vpc", "create", "prod", "--cidr", "10.5.0.0/16")
    assert code == 4 and "already" in out
    code, out = run("vpc", "create", "x", "--cidr", "10.0.0.0/99", "-o", "json")
    assert code == 2
    err = json.loads(out.strip().splitlines()[-1])["error"]
    assert err["status"] == 422 and err["field"] == "cidr" and err["exit_code"] == 2
    assert tianji(c.url, "tjt-wrong", "vpc", "list")[0] == 5
    assert run("eip-pool", "create", "203.0.113.0/28")[0] == 5  # a tenant may not
    assert tianji(f"http://127.0.0.1:{free_port()}", tok, "vpc", "list")[0] == 6
    code, out = run("vpc", "list", "-c", "nosuch")
    assert code == 2 and "-c nosuch: no such column" in out
    assert run("vpc", "list", "-o", "xml")[0] == 2


def test_every_command_option_and_argument_has_a_help_line_and_the_shared_options() -> None:
    cmd = typer.main.get_command(app)
    bare, without = [], []

    def walk(c, path: list[str]) -> None:
        if hasattr(c, "commands"):
            for n, s in c.commands.items():
                walk(s, [*path, n])
            return
        if not (c.help or "").strip():
            bare.append(" ".join(path))
        for p in c.params:  # every option and argument too
            if p.name != "help" and not (getattr(p, "help", None) or "").strip():
                bare.append(f"{' '.join(path)} {p.opts[0] if p.opts else p.name}")
        if path[0] not in ("controller", "agent", "gateway", "cluster", "pki") and \
                not {"-o", "-c"} <= {o for p in c.params for o in getattr(p, "opts", [])}:
            without.append(" ".join(path))

    walk(cmd, [])
    assert bare == [] and without == []
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "--install-completion" in out and "--show-completion" in out


def test_the_examples_in_docs_cli_run_as_written(controller: Controller, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    tenant = controller.tenant("docs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIANJI_")} | {
        "HOME": str(tmp_path), "TIANJI_URL": controller.url, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    outs = []
    for block, token in zip(blocks, (tenant.token, controller.admin_token, controller.admin_token), strict=True):
        r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block], env=env | {"TIANJI_TOKEN": token},
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{block}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
        outs.append(r.stdout)
    assert "10.20.1.2" in outs[0] and "name: www-a" in outs[0] and "exit status 3" in outs[0]
    assert "web" in outs[0].split("name: www-a", 1)[1]
    assert "hv9" in outs[1] and "admin" in outs[1]
    assert "UNREACHABLE" in outs[2] and "exit status 8" in outs[2]


def test_the_components_help_lines_are_their_own() -> None:
    """`tianji --help` lists the components without importing them: the line it shows is each one's own."""
    import importlib

    from tianjictl.main import COMPONENTS

    for name, (module, attr, help_, _) in COMPONENTS.items():
        assert getattr(importlib.import_module(module), attr).info.help == help_, name
