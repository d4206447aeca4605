"""`make demo`: a tenant builds a VPC with the CLI, then traffic flows between VMs on two emulated hypervisors.

Steps: start the controller (SQLite), create a tenant, two VPCs, subnets, ports and a peering with the
`tianji` CLI (its tables are printed as they come), then bring up two hypervisor namespaces, each with its
own Open vSwitch and `tianji agent`, plug VMs for the ports and check connectivity. Everything it creates
is removed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 160)
BIN = Path(sys.executable).parent / "tianji"


def step(title: str) -> None:
    console.rule(f"[bold]{title}")


def cli(env: dict, *args: str, quiet: bool = False) -> dict | list | None:
    console.print(f"[dim]$ tianji {' '.join(args)}[/dim]")
    shown = subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True)
    if shown.returncode != 0:
        console.print(shown.stderr)
        raise SystemExit(f"demo step failed: tianji {' '.join(args)}")
    if not quiet:
        console.print(shown.stdout.rstrip())
    return None


def api(env: dict, *args: str) -> dict | list:
    r = subprocess.run([str(BIN), "--json", *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main() -> None:
    state = Path(tempfile.mkdtemp(prefix="tianji-demo-"))
    port = 18900 + os.getpid() % 1000
    step("1. start the controller (SQLite in a fresh state directory)")
    ctl = subprocess.Popen([str(BIN), "controller", "serve", "--host", "0.0.0.0", "--port", str(port),
                            "--state-dir", str(state), "--log-level", "warning"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    fabric = None
    try:
        deadline = time.time() + 20
        while not (state / "admin.token").exists() or subprocess.run(
                ["curl", "-sf", f"http://127.0.0.1:{port}/healthz"], capture_output=True).returncode:
            if time.time() > deadline or ctl.poll() is not None:
                raise SystemExit("the controller did not start:\n" + (ctl.stdout.read() if ctl.stdout else ""))
            time.sleep(0.2)
        admin = (state / "admin.token").read_text().strip()
        console.print(f"controller at http://127.0.0.1:{port}, admin token in {state / 'admin.token'}")
        env_admin = os.environ | {"TIANJI_URL": f"http://127.0.0.1:{port}", "TIANJI_TOKEN": admin}

        step("2. the admin creates a tenant")
        tenant = api(env_admin, "tenant", "create", "acme")
        env = env_admin | {"TIANJI_TOKEN": tenant["token"]}
        console.print(f"tenant acme: {tenant['id']}")

        roots = None
        if os.geteuid() == 0:
            from topologies.hosts import Fabric

            step("3. two hypervisors: private Open vSwitch + tianji agent each")
            fabric = Fabric()
            roots = {n: fabric.add_hypervisor(n) for n in ("hv1", "hv2")}
            for h in roots.values():
                fabric.start_agent(h, port, admin)
            while len(api(env_admin, "host", "list")) < 2:
                time.sleep(0.2)
            cli(env_admin, "host", "list")

        step("4. the tenant builds its network with the CLI")
        vpc = api(env, "vpc", "create", "prod", "--cidr", "10.0.0.0/16")
        data = api(env, "vpc", "create", "data", "--cidr", "10.1.0.0/16")
        cli(env, "vpc", "list")
        web = api(env, "subnet", "create", "web", "--vpc", vpc["id"], "--cidr", "10.0.1.0/24")
        app = api(env, "subnet", "create", "app", "--vpc", vpc["id"], "--cidr", "10.0.2.0/24")
        db = api(env, "subnet", "create", "db", "--vpc", data["id"], "--cidr", "10.1.1.0/24")
        cli(env, "subnet", "list")
        hosts = ("hv1", "hv2", "hv2", "hv1") if roots else (None,) * 4
        ports = {}
        for (name, sn), host in zip((("web1", web), ("web2", web), ("app1", app), ("db1", db)), hosts,
                                    strict=True):
            extra = ["--host", host] if host else []
            ports[name] = (api(env, "port", "create", name, "--subnet", sn["id"], *extra), sn)
        cli(env, "port", "list")
        pc = api(env, "peering", "create", "--requester", vpc["id"], "--accepter", data["id"])
        cli(env, "peering", "list")
        # the data VPC's default group admits only its own members: let the peered prod VPC in
        cli(env, "sg", "rule-add", data["default_security_group_id"], "--direction", "ingress",
            "--remote-cidr", "10.0.0.0/16")
        cli(env, "route", "list", "--vpc", vpc["id"])
        cli(env, "sg", "show", vpc["default_security_group_id"])

        if not roots:
            console.print("[yellow]not root: skipping the data plane (run `make demo` as root to see traffic)")
            return
        step("5. VMs plugged on the hypervisors; traffic")
        vms = {n: fabric.add_vm(n, roots[p["host"]], p | {"gateway_ip": sn["gateway_ip"]})
               for n, (p, sn) in ports.items()}
        time.sleep(1.5)
        results = Table(title="connectivity", header_style="bold cyan")
        for c in ("check", "from", "to", "expect", "result", "latency"):
            results.add_column(c)

        def ping(src: str, dst_ip: str) -> tuple[bool, str]:
            vms[src].exec("ping", "-c", "1", "-W", "1", dst_ip, check=False)  # warm up VTEP ARP
            r = vms[src].exec("ping", "-c", "3", "-i", "0.2", "-W", "1", dst_ip, check=False)
            avg = next((ln.split("/")[4] for ln in r.stdout.splitlines() if "min/avg" in ln), "-")
            return r.returncode == 0, f"{avg} ms" if avg != "-" else "-"

        checks = [("same subnet, cross host", "web1", "web2", True),
                  ("cross subnet, cross host", "web1", "app1", True),
                  ("cross subnet, same host", "app1", "web2", True),
                  ("peering (distributed)", "web1", "db1", True)]
        ok_all = True
        for label, a, b, want in checks:
            ok, lat = ping(a, vms[b].ip)
            ok_all &= ok == want
            results.add_row(label, a, f"{b} {vms[b].ip}", "reach" if want else "blocked",
                            "[green]ok" if ok == want else "[red]FAIL", lat)
        cli(env, "peering", "delete", pc["id"])
        time.sleep(1.0)
        ok, _ = ping("web1", vms["db1"].ip)
        ok_all &= not ok
        results.add_row("peering deleted", "web1", f"db1 {vms['db1'].ip}", "blocked",
                        "[green]ok" if not ok else "[red]FAIL", "-")
        console.print(results)
        subprocess.run([str(BIN), "agent", "status", "--state-dir", str(fabric.base / "agents")])
        if not ok_all:
            raise SystemExit("demo: a connectivity check failed")
        console.print("[bold green]demo complete: tenant traffic flows over VXLAN between two hypervisors")
    finally:
        if fabric is not None:
            fabric.teardown()
        ctl.terminate()
        ctl.wait(10)


if __name__ == "__main__":
    main()
