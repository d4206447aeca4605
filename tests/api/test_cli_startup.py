"""`tianji` starts quietly and imports only what the command needs: `--help` and a tenant's `vpc list` load no
component (no OVS, os-ken, pyroute2, Mininet, FastAPI, SQLAlchemy, nor the PKI's cryptography), neither httpx
nor pydantic, and print no warning. How long it takes is bench/cli.py's (ratios against the interpreter's own
start); this test prints the import time it saw."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.controller import Controller

HEAVY = ("ovs", "os_ken", "eventlet", "pyroute2", "mininet", "fastapi", "sqlalchemy", "uvicorn", "yaml", "cryptography",
         "vswitch_agent", "nfv_gateways", "topologies", "controller",
         "pydantic",  # typer 0.29 builds a TypeAdapter per parameter with it (pyproject.toml keeps typer below)
         "httpx", "httpcore",  # a command's requests go on the standard library's HTTP (tianji/plain_http.py)
         "markdown_it")  # rich's help formatter's (the help is click's)
RUN = "import sys; sys.argv = ['tianji', *sys.argv[1:]]; from tianjictl.main import main; main()"


def tianji_importtime(*args: str, home: Path) -> tuple[int, str, str, dict[str, int]]:
    """(exit status, stdout, stderr less the import lines, {top-level module: cumulative µs})."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIANJI_")} | {"HOME": str(home),
                                                                                 "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", RUN, *args], capture_output=True, text=True,
                       env=env, timeout=60)
    mods, rest = {}, []
    for line in r.stderr.splitlines():
        if m := re.match(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|( *)(\S+)", line):
            mods[m.group(4)] = int(m.group(2))
        elif not line.startswith("import time:"):
            rest.append(line)
    return r.returncode, r.stdout, "\n".join(rest), mods


def test_help_and_a_tenants_list_import_no_component_and_warn_nothing(controller: Controller,
                                                                        tmp_path: Path) -> None:
    t = controller.tenant()
    t.post("/v1/vpcs", {"name": "quick", "cidr": "10.8.0.0/16"})
    token = t.http.headers["Authorization"].split()[1]
    for args in (("--help",), ("--url", controller.url, "--token", token, "vpc", "list")):
        code, out, err, mods = tianji_importtime(*args, home=tmp_path)
        assert code == 0, err
        assert err.strip() == "", f"tianji {' '.join(args[-2:])} printed on stderr: {err}"
        heavy = HEAVY + (("http", "ssl") if args == ("--help",) else ())  # help speaks no HTTP
        loaded = [m for m in mods if m.split(".")[0] in heavy or m in heavy]
        assert loaded == [], f"tianji {args[-1]} imported {loaded}"
        print(f"tianji {' '.join(args[-2:])}: tianjictl.main imported in {mods['tianjictl.main'] / 1000:.0f} ms")
    assert "quick" in out


def test_a_component_is_imported_when_named(tmp_path: Path) -> None:
    code, out, err, mods = tianji_importtime("cluster", "--help", home=tmp_path)
    # importlib.import_module is not timed by -X importtime: what topologies.cli imports is
    assert code == 0 and "topologies.cluster" in mods and "vm" in out, err
    assert "Eventlet" not in err and "Warning" not in err, err


def test_the_admin_token_from_the_state_dir_is_said(controller: Controller, tmp_path: Path) -> None:
    (tmp_path / "admin.token").write_text(controller.admin_token)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIANJI_")} | {
        "HOME": str(tmp_path), "TIANJI_STATE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", RUN, "--url", controller.url, "whoami", "-o", "value", "-c", "kind"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "admin", r.stderr
    assert "acting as the admin" in r.stderr and str(tmp_path / "admin.token") in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", RUN, "--url", controller.url, "--token", controller.tenant().token,
                        "whoami", "-o", "value", "-c", "kind"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "tenant" and "admin" not in r.stderr, r.stderr
