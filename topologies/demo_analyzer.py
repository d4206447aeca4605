"""The demo's analyzer step: the checks the demo just ran with real packets, asked of the reachability analyzer
(`tianji trace --live`): its verdict must be what the packets found, and each source hypervisor's Open vSwitch
must send the packet where the model does."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 150, emoji=False)  # ":100:" in an IPv6 address is not an emoji
# (what, source VM, destination VM (or an address), protocol, port, reachable)
CASES = [("same subnet, cross host", "acme/web1", "acme/web2", "icmp", None, True),
         ("peering (peer VNI)", "acme/web1", "acme/db1", "icmp", None, True),
         ("isolation: globex -> acme app", "globex/web1", "acme/app1", "icmp", None, False),
         ("security group: HTTP allowed", "acme/app1", "acme/www", "tcp", 80, True),
         ("security group: ICMP not allowed", "acme/app1", "acme/www", "icmp", None, False)]


def analyzer(tianji: str, env: dict, vms: dict, inet_ip: str, results: Table, step: Callable[[str], None]) -> int:
    step("4e. why can't A reach B? the reachability analyzer on the same questions, and each switch's own answer")
    failures = 0
    for what, src, dst, proto, port, want in [*CASES, ("internet via NAT gateway", "acme/web1", inet_ip, "tcp", 80,
                                                       True)]:
        target = vms[dst]["ip"] if dst in vms else dst
        args = [tianji, "trace", vms[src]["port_id"], target, "--proto", proto, "--live", "-o", "json",
                *(["--port", str(port)] if port else [])]
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        try:
            a = json.loads(r.stdout)
        except ValueError:
            a = {"verdict": "error", "reason": r.stderr.strip()[-200:], "live": None}
        live = a.get("live") or {}
        good = (a["verdict"] == "reachable") == want and live.get("agrees") is True
        failures += not good
        said = "the switch agrees" if live.get("agrees") else live.get("note") or "not asked"
        results.add_row(f"analyzer: {what}", src, f"{dst} {target}" if dst in vms else target,
                        "reach" if want else "blocked", "[green]ok" if good else f"[red]FAIL ({a['reason']})",
                        a["verdict"], said)
        if what.startswith("security group: ICMP"):
            console.print(f"[dim]$ tianji trace acme/app1 -> acme/www icmp --live[/dim]\n{a['reason']}; {said}")
    return failures
