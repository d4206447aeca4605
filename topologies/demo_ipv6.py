"""The demo's dual-stack line: a VPC with an IPv6 /56 from the operator's pool, its VMs' addresses taken by SLAAC
from the router advertisements their switches send (equal to what the API shows), ping6 across hosts and across
subnets, and a peer VPC of a smaller MTU that answers a longer packet with packet too big."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from topologies.cluster import TIANJI, Cluster

say = Console(emoji=False, highlight=False, soft_wrap=True).print  # ":100:" in an IPv6 address is no emoji

def _tj(env: dict, *args: str) -> dict:
    r = subprocess.run([TIANJI, "--json", *args], env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"tianji {' '.join(args)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def _global6(c: Cluster, vm: str) -> set[str]:
    out = c.vm_exec(vm, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global").stdout
    return {ln.split()[3].split("/")[0] for ln in out.splitlines() if "tentative" not in ln}


def dual_stack(c: Cluster, env: dict, orchestrator_env: dict, results: Table, step: Callable[[str], None]) -> int:
    step("4g. a dual-stack VPC: IPv6 addresses by SLAAC from the switches' router advertisements, ping6 across "
         "hosts and subnets; a peer VPC of MTU 1280 answers a longer packet with packet too big")
    vpc = _tj(env, "vpc", "create", "dual", "--cidr", "10.8.0.0/16", "--ipv6-cidr", "auto")
    small = _tj(env, "vpc", "create", "small-mtu", "--cidr", "10.9.0.0/16", "--ipv6-cidr", "auto", "--mtu", "1280")
    subnets = [_tj(env, "subnet", "create", n, "--vpc", v["id"], "--cidr", cidr, "--ipv6-cidr", "auto")
               for n, v, cidr in (("v6a", vpc, "10.8.1.0/24"), ("v6b", vpc, "10.8.2.0/24"),
                                  ("v6c", small, "10.9.1.0/24"))]
    _tj(env, "peering", "create", "--requester", vpc["id"], "--accepter", small["id"])
    _tj(env, "sg", "rule-add", small["default_security_group_id"], "--direction", "ingress", "--ethertype", "IPv6",
        "--remote-cidr", vpc["ipv6_cidr"])
    say(f"  VPC dual {vpc['ipv6_cidr']}: " + ", ".join(f"{s['name']} {s['ipv6_cidr']}" for s in subnets[:2]))
    vms = {}
    for name, sn, host in (("v6web1", subnets[0], "hv1"), ("v6web2", subnets[0], "hv2"), ("v6app1", subnets[1], "hv3"),
                           ("v6small", subnets[2], "hv2")):
        port = _tj(env, "port", "create", name, "--subnet", sn["id"])
        subprocess.run([TIANJI, "port", "bind", port["id"], host], env=orchestrator_env, capture_output=True,
                       check=True)
        vms[name] = c.vm_add(port["id"], f"a{name}", dhcp=True) | {"ipv6": port["ipv6"]}
    failures = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20 and any(v["ipv6"] not in _global6(c, v["name"]) for v in vms.values()):
        time.sleep(0.5)
    for v in vms.values():
        got = _global6(c, v["name"])
        say(f"  {v['name']}: the API says {v['ipv6']}, eth0 has {', '.join(sorted(got)) or 'nothing'} (SLAAC)")

    def ping6(src: str, dst: str, *extra: str) -> tuple[bool, str]:
        for _ in range(3):  # the first packets are spent on neighbour discovery and the new VTEP's MAC
            c.vm_exec(vms[src]["name"], "ping", "-6", "-c", "1", "-W", "1", vms[dst]["ipv6"])
        r = c.vm_exec(vms[src]["name"], "ping", "-6", "-c", "5", "-i", "0.2", "-W", "1", *extra, vms[dst]["ipv6"])
        avg = next((ln.split("/")[4] for ln in r.stdout.splitlines() if "min/avg" in ln), None)
        return r.returncode == 0, f"{float(avg):.2f} ms" if avg else "-"

    for check, src, dst in (("IPv6 (SLAAC), cross host", "v6web1", "v6web2"),
                            ("IPv6, cross subnet", "v6web1", "v6app1"), ("IPv6 over a peering", "v6web1", "v6small")):
        good, lat = ping6(src, dst)
        good = good and vms[src]["ipv6"] in _global6(c, vms[src]["name"])
        failures += not good
        results.add_row(check, f"acme/{src}", f"{dst} {vms[dst]['ipv6']}", "reach", "[green]ok" if good else
                        "[red]FAIL", lat, "-")
    c.vm_exec(vms["v6web1"]["name"], "ping", "-6", "-c", "1", "-W", "1", "-M", "do", "-s", "1400",
              vms["v6small"]["ipv6"])
    route = c.vm_exec(vms["v6web1"]["name"], "ip", "-6", "route", "get", vms["v6small"]["ipv6"]).stdout
    good = "mtu 1280" in route
    failures += not good
    results.add_row("IPv6 packet too big (peer MTU 1280)", "acme/v6web1", "v6small, 1,448 bytes", "told mtu 1280",
                    "[green]ok" if good else f"[red]FAIL ({route.strip()})", "-", "-")
    return failures
