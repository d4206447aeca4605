"""`make demo`: the `small` cluster, two tenants with the same addresses, peering, isolation, security groups, a load
balancer, a private line, the cluster's object store through service endpoints.

    python -m topologies.demo [--keep]

Brings up the emulated cluster (controller, 3 hypervisors each with Open vSwitch and a tianji agent), lets two
tenants build networks with the `tianji` CLI (both use 10.0.0.0/16 and the very same VM addresses), plugs VMs
across the hypervisors, and checks what a user would: ping, TCP throughput (iperf3) and HTTP (curl) where
traffic must flow, silence where it must not. Prints the results; tears down unless --keep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from topologies import netns
from topologies.cluster import DEFAULT_STATE, TIANJI, Cluster
from topologies.cluster_state import State
from topologies.demo_analyzer import analyzer
from topologies.demo_guests import real_guests
from topologies.demo_ipv6 import dual_stack
from topologies.demo_replicas import replica_failover
from topologies.site import Neighbor, SiteRouter

console = Console(width=None if sys.stdout.isatty() else 150, emoji=False)  # ":100:" in an IPv6 address is not an emoji
NAME = "demo"


# a backend that answers any GET with its name (the load balancer's demo)
NAMED_HTTP = """
import http.server, socketserver, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = sys.argv[1].encode(); self.send_response(200)
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def load_balancer(ea: dict, vpc: dict, subnet: dict, vms: dict) -> list[subprocess.Popen]:
    """VIP 10.0.1.100:80 in acme's web subnet, web1 and web2 its members on 8080 (each answers with its name), an
    HTTP monitor; waits until both are ONLINE and shows them. Returns the backends' processes."""
    tj(ea, "sg", "rule-add", vpc["default_security_group_id"], "--direction", "ingress", "--protocol", "tcp",
       "--port", "8080", show=False)
    lb = tj(ea, "lb", "create", "www", "--vpc", vpc["id"], "--subnet", subnet["id"], "--vip", "10.0.1.100",
            show=False)
    pool = tj(ea, "lb", "pool-create", lb["id"], "--name", "web", "--protocol", "tcp", show=False)
    tj(ea, "lb", "listener-create", lb["id"], "--protocol", "tcp", "--port", "80", "--pool", pool["id"], show=False)
    for name in ("web1", "web2"):
        tj(ea, "lb", "member-add", pool["id"], "--port", vms[f"acme/{name}"]["port_id"], "--protocol-port", "8080",
           show=False)
    tj(ea, "lb", "monitor-set", pool["id"], "--type", "http", "--interval", "1", "--timeout", "0.5", show=False)
    backends = [netns.popen(sys.executable, "-c", NAMED_HTTP, n, ns=vms[f"acme/{n}"]["ns"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in ("web1", "web2")]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20 and any(m["operating_status"] != "ONLINE"
                                              for m in tj(ea, "lb", "members", pool["id"], show=False)):
        time.sleep(0.5)
    tj(ea, "lb", "list")
    tj(ea, "lb", "members", pool["id"])
    return backends


def private_line(c: Cluster, ea: dict, vpc: dict, vms: dict, results: Table) -> int:
    """site1's router (FRR, its trunk tagged by OVS) peers with the line's two sessions; the VPC learns its LAN by
    BGP; a VM and the site's LAN host reach each other. Returns the failed checks."""
    site = SiteRouter(c.state, "site1").start()
    line = tj(ea, "private-line", "create", "dc1", "--vpc", vpc["id"], "--vlan", "100", "--customer-asn", "65010",
              "--customer-ip", "169.254.100.2/30", "--local-ip", "169.254.100.1/30", "--secondary-customer-ip",
              "169.254.101.2/30", "--secondary-local-ip", "169.254.101.1/30", show=False)
    tj(ea, "sg", "rule-add", vpc["default_security_group_id"], "--direction", "ingress", "--remote-cidr",
       site.lan, show=False)
    site.add_vlan(100, "169.254.100.2/30")
    subprocess.run(["ip", "-n", site.ns, "addr", "replace", "169.254.101.2/30", "dev", "v100"], check=True)
    site.bgp([Neighbor("169.254.100.1", 64512), Neighbor("169.254.101.1", 64512)])
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        got = tj(ea, "private-line", "show", line["id"], show=False)
        if sum(s["bgp_state"] == "Established" for s in got["sessions"]) == 2 and got["learned_routes"]:
            break
        time.sleep(0.5)
    console.print(f"  both sessions established and {site.lan} learned in {time.monotonic() - t0:.1f} s")
    tj(ea, "private-line", "show", line["id"])
    tj(ea, "route", "list", "--vpc", vpc["id"])
    c.wait_converged()
    failures = 0
    for check, ok in (("private line: VM -> on-premise host", any(
            c.vm_exec(vms["acme/web1"]["name"], "ping", "-c", "1", "-W", "1", site.lan_host).returncode == 0
            for _ in range(5))),
            ("private line: on-premise host -> VM", site.lan_exec(
                "ping", "-c", "3", "-i", "0.2", "-W", "1", vms["acme/web1"]["ip"]).returncode == 0)):
        failures += not ok
        results.add_row(check, "acme/web1" if "VM ->" in check else "site1 LAN",
                        site.lan_host if "VM ->" in check else vms["acme/web1"]["ip"], "reach",
                        "[green]ok" if ok else "[red]FAIL", "-", "-")
    return failures


# what a VM runs to fetch by name: ask the resolver its DHCP answer named (its resolv.conf), then GET the object
FETCH_BY_NAME = r"""
import http.client, socket, struct, sys
name, path, conf = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
server = next(l.split()[1] for l in conf.splitlines() if l.startswith("nameserver"))
q = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"".join(
    bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
for _ in range(10):  # the name is there once the VM's switch has the endpoint
    s.sendto(q, (server, 53))
    try:
        a = s.recv(512)
    except OSError:
        continue
    if a[7]:  # an answer, not NXDOMAIN
        break
addr = socket.inet_ntoa(a[-4:])
for _ in range(10):
    try:
        h = http.client.HTTPConnection(addr, 80, timeout=2); h.request("GET", path)
        print(addr, h.getresponse().read().decode().strip()); break
    except OSError:
        pass
"""


def services(c: Cluster, env: dict, tenants: dict, vms: dict, results: Table) -> int:
    """The operator registers the cluster's object store; acme and globex (the same CIDR, the same VM addresses)
    each make an endpoint in their web subnet, and their web1 fetches an object through it by name. Returns the
    failed checks."""
    from pathlib import Path

    addr, port = c.service_address("store")
    svc = tj(env, "service", "create", "store", "--address", addr, "--port", f"tcp/{port}", show=False)
    tj(env, "service", "list")
    failures, eps = 0, {}
    for label, (e, vpc, web) in tenants.items():
        eps[label] = tj(e, "endpoint", "create", "--service", svc["id"], "--vpc", vpc["id"], "--subnet", web["id"],
                        show=False)
        tj(e, "endpoint", "list")
    c.wait_converged()
    for label, ep in eps.items():
        vm = vms[f"{label}/web1"]
        conf = Path(c.state.dir) / f"{vm['name']}.resolv.conf"
        r = c.vm_exec(vm["name"], sys.executable, "-c", FETCH_BY_NAME, ep["dns_name"], "/objects/hello.txt",
                      str(conf))
        got = r.stdout.strip()
        good = got.startswith(f"{ep['address']} hello from the cluster's object store")
        failures += not good
        results.add_row(f"service endpoint: {ep['dns_name']}", f"{label}/web1", f"store {addr}:{port}",
                        f"object, seen as {ep['source_address']}", "[green]ok" if good else f"[red]FAIL ({got!r})",
                        "-", "-")
    return failures


def step(title: str) -> None:
    console.rule(f"[bold]{title}")


def tj(env: dict, *args: str, show: bool = True) -> dict | list | None:
    """Run the CLI as a user would; print its table, return its JSON."""
    if show:
        console.print(f"[dim]$ tianji {' '.join(args)}[/dim]")
        r = subprocess.run([TIANJI, *args], env=env, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"tianji {' '.join(args)} failed: {r.stderr.strip()}")
        console.print(r.stdout.rstrip())
        return None
    r = subprocess.run([TIANJI, "--json", *args], env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"tianji {' '.join(args)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout) if r.stdout.strip().startswith(("{", "[")) else None


def pg_admin_url() -> str:
    return os.environ.get("TIANJI_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def demo_database(drop: bool = False) -> str | None:
    """A fresh PostgreSQL database for the demo's replicas, if PostgreSQL answers at 127.0.0.1:5432; else None.
    `drop`: remove it (the demo's end)."""
    from sqlalchemy import create_engine, text

    admin = pg_admin_url()
    try:
        engine = create_engine(admin, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text('DROP DATABASE IF EXISTS "tianji_demo" WITH (FORCE)'))
            if not drop:
                conn.execute(text('CREATE DATABASE "tianji_demo"'))
        engine.dispose()
    except Exception:
        return None
    return admin.rsplit("/", 1)[0] + "/tianji_demo"


def main() -> None:
    keep = "--keep" in sys.argv
    if (DEFAULT_STATE / NAME / "state.json").exists():
        console.print("[yellow]a previous demo cluster is still up: removing it first")
        Cluster(State.load(DEFAULT_STATE / NAME)).down()
    step("1. bring up the `small` emulated cluster")
    database_url = demo_database()
    where = pg_admin_url().split("@")[-1].rsplit("/", 1)[0]
    console.print("[cyan]>[/cyan] " + (f"two controller replicas on PostgreSQL ({where}, database tianji_demo)"
                                       if database_url else f"one controller on SQLite: PostgreSQL at {where} "
                                       "does not answer (replicas need it; TIANJI_PG_URL says where it is)"))
    c = Cluster.up("small", name=NAME, database_url=database_url, controllers=2 if database_url else 1,
                   progress=lambda m: console.print(f"[cyan]>[/cyan] {m}"))
    ok = False
    try:
        env = os.environ | {"TIANJI_URL": c.state.controller_url, "TIANJI_TOKEN": c.state.admin_token,
                            "TIANJI_CA": c.state.ca}
        tj(env, "host", "list")

        step("2. two tenants, the same CIDR, the same VM addresses")
        acme = tj(env, "tenant", "create", "acme", show=False)
        globex = tj(env, "tenant", "create", "globex", show=False)
        ea, eg = env | {"TIANJI_TOKEN": acme["token"]}, env | {"TIANJI_TOKEN": globex["token"]}
        eo = env | {"TIANJI_TOKEN": c.state.orchestrator_token}
        nets = {}
        for label, e in (("acme", ea), ("globex", eg)):
            vpc = tj(e, "vpc", "create", "prod", "--cidr", "10.0.0.0/16", show=False)
            web = tj(e, "subnet", "create", "web", "--vpc", vpc["id"], "--cidr", "10.0.1.0/24", show=False)
            app = tj(e, "subnet", "create", "app", "--vpc", vpc["id"], "--cidr", "10.0.2.0/24", show=False)
            nets[label] = (vpc, web, app)
        avpc, aweb, aapp = nets["acme"]
        gvpc, gweb, _ = nets["globex"]
        data = tj(ea, "vpc", "create", "data", "--cidr", "10.1.0.0/16", show=False)
        db = tj(ea, "subnet", "create", "db", "--vpc", data["id"], "--cidr", "10.1.1.0/24", show=False)
        peering = tj(ea, "peering", "create", "--requester", avpc["id"], "--accepter", data["id"], show=False)
        tj(ea, "sg", "rule-add", data["default_security_group_id"], "--direction", "ingress",
           "--remote-cidr", "10.0.0.0/16")  # the data VPC admits the peered prod VPC
        websg = tj(ea, "sg", "create", "web", "--vpc", avpc["id"], show=False)  # a new group allows all egress
        tj(ea, "sg", "rule-add", websg["id"], "--direction", "ingress", "--protocol", "tcp", "--port", "80")
        tj(ea, "sg", "show", websg["id"])
        # the internet through a NAT gateway: an EIP, SNAT for the web subnet, a default route
        eip = tj(ea, "eip", "create", show=False)
        natgw = tj(ea, "nat-gateway", "create", "--vpc", avpc["id"], "--eip", eip["id"], show=False)
        tj(ea, "nat-gateway", "snat-add", natgw["id"], "--subnet", aweb["id"], "--eip", eip["id"], show=False)
        tj(ea, "route", "create", "--vpc", avpc["id"], "--destination", "0.0.0.0/0",
           "--target", f"nat-gateway:{natgw['id']}")
        tj(ea, "vpc", "list")
        tj(ea, "peering", "list")
        tj(ea, "route", "list", "--vpc", avpc["id"])

        step("3. ports and VMs across the hypervisors (addresses by DHCP from the switch)")
        plan = [("acme", "web1", aweb, "hv1", "10.0.1.10", None), ("acme", "web2", aweb, "hv2", "10.0.1.11", None),
                ("acme", "app1", aapp, "hv3", "10.0.2.10", None), ("acme", "db1", db, "hv2", "10.1.1.10", None),
                ("acme", "www", aweb, "hv3", "10.0.1.80", websg["id"]),
                ("globex", "web1", gweb, "hv2", "10.0.1.10", None), ("globex", "web2", gweb, "hv3", "10.0.1.11", None),
                ("globex", "web3", gweb, "hv1", "10.0.1.12", None)]
        vms = {}
        for tenant, name, sn, host, ip, sg in plan:
            e = ea if tenant == "acme" else eg
            args = ["port", "create", name, "--subnet", sn["id"], "--ip", ip]
            port = tj(e, *args + (["--sg", sg] if sg else []), show=False)
            tj(eo, "port", "bind", port["id"], host, show=False)  # the orchestrator places the VM, as Nova would
            vm = c.vm_add(port["id"], f"{tenant[0]}{name}", dhcp=True)
            vms[f"{tenant}/{name}"] = vm
            console.print(f"  {tenant}/{name:5} on {host}: {vm['ip']} (DHCP)")
        tj(ea, "port", "list")

        step("3b. a load balancer: a VIP in front of web1 and web2, HTTP health checks from their vSwitches")
        backends = load_balancer(ea, avpc, aweb, vms)

        step("4. traffic")
        web = netns.popen(sys.executable, "-c", "import http.server, socketserver; socketserver.TCPServer(('0.0.0.0', "
                          "80), http.server.SimpleHTTPRequestHandler).serve_forever()", ns=vms["acme/www"]["ns"],
                          cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results = Table(title="what the tenants see", header_style="bold cyan")
        for col in ("check", "from", "to", "expect", "result", "latency", "TCP throughput"):
            results.add_column(col)
        failures = 0

        def ping(src: str, ip: str) -> tuple[bool, str]:
            for _ in range(3):  # the first packet to a new VTEP is spent on OVS resolving its MAC
                c.vm_exec(vms[src]["name"], "ping", "-c", "1", "-W", "1", ip)
            r = c.vm_exec(vms[src]["name"], "ping", "-c", "5", "-i", "0.2", "-W", "1", ip)
            avg = next((ln.split("/")[4] for ln in r.stdout.splitlines() if "min/avg" in ln), None)
            return r.returncode == 0, f"{float(avg):.2f} ms" if avg else "-"

        def iperf(src: str, dst: str) -> str:
            srv = netns.popen("iperf3", "-s", "-1", ns=vms[dst]["ns"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
            time.sleep(0.3)
            out = c.vm_exec(vms[src]["name"], "iperf3", "-c", vms[dst]["ip"], "-t", "2", "-J").stdout
            srv.kill()
            try:
                return f"{json.loads(out)['end']['sum_received']['bits_per_second'] / 1e6:.0f} Mbit/s"
            except (ValueError, KeyError):
                return "failed"

        def row(check: str, src: str, dst: str, want: bool, tput: bool = False) -> None:
            nonlocal failures
            got, lat = ping(src, vms[dst]["ip"])
            t = iperf(src, dst) if (tput and got) else "-"
            good = got == want and t != "failed"
            failures += not good
            results.add_row(check, src, f"{dst} {vms[dst]['ip']}", "reach" if want else "blocked",
                            "[green]ok" if good else "[red]FAIL", lat if got else "-", t)

        row("same subnet, cross host", "acme/web1", "acme/web2", True, tput=True)
        row("cross subnet, cross host", "acme/web1", "acme/app1", True, tput=True)
        row("peering (hv1 -> hv2, peer VNI)", "acme/web1", "acme/db1", True, tput=True)
        row("same IP, other tenant", "globex/web1", "globex/web2", True)
        row("isolation: globex -> acme app", "globex/web1", "acme/app1", False)
        row("isolation: acme -> globex-only IP", "acme/app1", "globex/web3", False)
        http = c.vm_exec(vms["acme/app1"]["name"], "curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}",
                         "-m", "3", "http://10.0.1.80/")
        code, _, secs = http.stdout.partition(" ")
        good = code == "200"
        failures += not good
        results.add_row("security group: HTTP allowed", "acme/app1", "acme/www :80", "reach",
                        "[green]ok" if good else "[red]FAIL", f"{float(secs or 0) * 1000:.1f} ms", "-")
        row("security group: ICMP not allowed", "acme/app1", "acme/www", False)
        inet = c.state.nodes["inet"]
        seen_as = netns.popen(sys.executable, "-c",
                              "import http.server, socketserver\n"
                              "class H(http.server.BaseHTTPRequestHandler):\n"
                              "    def do_GET(self):\n"
                              "        b = self.client_address[0].encode(); self.send_response(200)\n"
                              "        self.send_header('Content-Length', str(len(b))); self.end_headers()\n"
                              "        self.wfile.write(b)\n"
                              "    def log_message(self, *a): pass\n"
                              "socketserver.TCPServer(('0.0.0.0', 80), H).serve_forever()",
                              ns=inet["ns"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        t0 = time.monotonic()
        got = ""
        while got != eip["address"] and time.monotonic() - t0 < 10:
            got = c.vm_exec(vms["acme/web1"]["name"], "curl", "-s", "-m", "1", f"http://{inet['ip']}/").stdout
        seen_as.kill()
        good = got == eip["address"]
        failures += not good
        results.add_row("internet via NAT gateway", "acme/web1", f"inet {inet['ip']}", f"seen as {eip['address']}",
                        "[green]ok" if good else f"[red]FAIL ({got or 'no answer'})", "-", "-")
        answers = [c.vm_exec(vms["acme/app1"]["name"], "curl", "-s", "-m", "2", "http://10.0.1.100/").stdout
                   for _ in range(20)]
        for b in backends:
            b.kill()
        good = {"web1", "web2"} <= set(answers)
        failures += not good
        results.add_row("load balancer: VIP 10.0.1.100:80", "acme/app1", "web1, web2 :8080", "both answer",
                        "[green]ok" if good else f"[red]FAIL ({sorted(set(answers))})",
                        f"{answers.count('web1')} / {answers.count('web2')} of 20", "-")
        step("4b. a private line: acme's data center (site1) on VLAN 100, BGP and BFD to both private-line instances")
        failures += private_line(c, ea, avpc, vms, results)
        step("4c. the cluster's object store: acme and globex (the same CIDR) fetch from it through their endpoints, "
             "by name")
        failures += services(c, env, {"acme": (ea, avpc, aweb), "globex": (eg, gvpc, gweb)}, vms, results)
        failures += analyzer(TIANJI, env, vms, c.state.nodes["inet"]["ip"], results, step)
        failures += real_guests(c, ea, eo, aweb, vms, results, step)
        failures += dual_stack(c, ea, eo, results, step)
        failures += replica_failover(c, vms, results, step)
        tj(ea, "peering", "delete", peering["id"], show=True)
        c.wait_converged()
        row("peering deleted", "acme/web1", "acme/db1", False)
        web.kill()
        console.print(results)
        subprocess.run([TIANJI, "agent", "status", "--state-dir", f"{c.state.dir}/agents"])
        ok = failures == 0
        if ok:
            console.print(f"[bold green]demo complete: cluster up in {c.state.up_seconds} s, every check passed")
        else:
            console.print(f"[bold red]{failures} check(s) failed")
    finally:
        if keep:
            console.print(f"cluster kept: `tianji cluster status --name {NAME}`, `tianji cluster down --name {NAME}`; "
                          f"export TIANJI_URL={c.state.controller_url} TIANJI_TOKEN={c.state.admin_token} "
                          f"TIANJI_CA={c.state.ca}")
        else:
            c.down()
            demo_database(drop=True) if database_url else None
            console.print("cluster torn down")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
