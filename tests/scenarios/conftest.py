"""Packet-level scenarios on the emulated cluster (`small`: 3 hypervisors, a gateway host, an external host).

One cluster per test session (bring-up takes seconds); every test makes its own tenants, VPCs and VMs and
removes its VMs afterwards, pass or fail, so any test can run alone (`pytest -k`).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import pg_wanted
from tests.support.controller import PgDatabase
from tests.support.wait import wait_for  # noqa: F401 -- the scenarios import it from here
from tianji.api_client import Client
from topologies.cluster import Cluster
from topologies.cluster_state import State
from topologies.dpdk_host import DPDK_VSWITCHD

NAME = "tjt"
STATE = Path("/run/tianji-cluster")


def require_prerequisites() -> None:
    tools = ("ovs-vswitchd", "tcpdump", "dhclient", "iperf3", "mnexec", "vtysh", "qemu-system-x86_64", "podman",
             "runc", "libvirtd", "virsh", "nsenter")
    missing = [t for t in tools if shutil.which(t) is None]
    missing += [DPDK_VSWITCHD] if not Path(DPDK_VSWITCHD).exists() else []
    if os.geteuid() != 0 or missing:
        pytest.fail("the scenario suite needs root and " + (", ".join(missing) or "nothing else") +
                    ": run `make setup` (apt-get install openvswitch-switch mininet tcpdump isc-dhcp-client iperf3 "
                    "frr qemu-system-x86 podman runc libvirt-daemon-system openvswitch-switch-dpdk)")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    require_prerequisites()
    if (STATE / NAME / "state.json").exists():  # a crashed earlier run: remove exactly what it made
        Cluster(State.load(STATE / NAME)).down()
    # with PostgreSQL (CI), as production runs: two controller replicas on it, every host given both
    db = PgDatabase() if pg_wanted() else None
    try:
        c = Cluster.up("small", name=NAME, state_dir=STATE, database_url=db.url if db else None,
                       controllers=2 if db else 1, progress=lambda m: None)
        try:
            yield c
        finally:
            if keep := os.environ.get("TIANJI_SCENARIO_LOGS"):  # the hosts' logs, kept for a failure's reader
                Path(keep).mkdir(parents=True, exist_ok=True)
                for log in Path(c.state.dir).rglob("*.log"):
                    shutil.copy(log, Path(keep) / "-".join(log.relative_to(c.state.dir).parts))
            c.down()
    finally:
        if db is not None:
            db.drop()


@dataclass
class Net:
    """A tenant's view for one test: its client, VPCs, subnets, and the VMs it plugged."""

    cluster: Cluster
    client: Client
    vpcs: dict[str, dict] = field(default_factory=dict)
    subnets: dict[str, dict] = field(default_factory=dict)
    vms: list[str] = field(default_factory=list)

    def vpc(self, name: str, cidr: str, subnets: dict[str, str], **kw) -> dict:
        v = self.client.post("/v1/vpcs", {"name": name, "cidr": cidr} | kw)
        self.vpcs[name] = v
        for sn_name, sn_cidr in subnets.items():
            self.subnets[sn_name] = self.client.post("/v1/subnets", {"vpc_id": v["id"], "name": sn_name,
                                                                     "cidr": sn_cidr})
        return v

    def vm(self, subnet: str, host: str, ip: str | None = None, dhcp: bool = False, kind: str = "netns",
           nic: str = "tap", **kw) -> dict:
        """A port bound to `host` and a VM plugged into it: a namespace, or a real KVM guest (`kind="kvm"`, which
        always takes its address by its own DHCP client; `nic="vhost-user"` on an OVS-DPDK host)."""
        body = {"subnet_id": self.subnets[subnet]["id"], "name": f"p{uuid.uuid4().hex[:6]}"} | kw
        if ip:
            body["ip"] = ip
        port = self.client.post("/v1/ports", body)
        port = self.cluster.orchestrator.patch(f"/v1/ports/{port['id']}", {"host": host})  # as Nova would
        name = f"v{uuid.uuid4().hex[:5]}"
        self.vms.append(name)
        info = self.cluster.vm_add(port["id"], name, dhcp=dhcp, kind=kind, progress=lambda m: None, nic=nic)
        return info | {"port": port}

    def container(self, subnet: str, host: str, security_group_ids: list[str] | None = None) -> dict:
        """A podman container in `subnet` on `host`: its port made and bound by tianji-cni (the orchestrator's
        token in the network's conflist), exactly as `podman run --network` does it."""
        from topologies.containers import container_add, network_add

        name = f"c{uuid.uuid4().hex[:5]}"
        net = network_add(self.cluster, name, self.subnets[subnet]["id"], host, security_group_ids)
        self.vms.append(name)
        info = container_add(self.cluster, net, name, host)
        port = next(p for p in self.client.get("/v1/ports", subnet_id=self.subnets[subnet]["id"])
                    if p["ip"] == info["ip"])
        return info | {"port": port, "port_id": port["id"]}


@pytest.fixture
def tenants(cluster: Cluster) -> Iterator[Callable[[], Net]]:
    made: list[Net] = []

    def make() -> Net:
        t = cluster.admin.post("/v1/tenants", {"name": f"t-{uuid.uuid4().hex[:8]}"})
        n = Net(cluster, cluster.client(t["token"]))
        made.append(n)
        return n

    yield make
    for n in made:
        cleanup(n)


def cleanup(n: Net) -> None:
    """Whatever a test's tenant made, its VMs first, so any test can run alone and after any other."""
    for vm in n.vms:
        if vm in n.cluster.state.vms:
            n.cluster.vm_remove(vm)
    for e in n.client.get("/v1/service-endpoints"):
        n.client.delete(f"/v1/service-endpoints/{e['id']}")
    for svc in n.client.get("/v1/services"):  # those it published
        if svc.get("owner_tenant_id"):
            n.client.delete(f"/v1/services/{svc['id']}")
    for pl in n.client.get("/v1/private-lines"):
        n.client.delete(f"/v1/private-lines/{pl['id']}")
    for lb in n.client.get("/v1/load-balancers"):
        n.client.delete(f"/v1/load-balancers/{lb['id']}")
    for gw in n.client.get("/v1/nat-gateways"):
        n.client.delete(f"/v1/nat-gateways/{gw['id']}")
    for p in n.client.get("/v1/ports"):
        n.client.delete(f"/v1/ports/{p['id']}")
    for e in n.client.get("/v1/eips"):
        n.client.delete(f"/v1/eips/{e['id']}")


def ex(cluster: Cluster, vm: dict, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return cluster.vm_exec(vm["name"], *cmd, timeout=timeout)


def ping(cluster: Cluster, vm: dict, ip: str, count: int = 3, wait: str = "1") -> bool:
    return ex(cluster, vm, "ping", "-c", str(count), "-i", "0.2", "-W", wait, ip).returncode == 0


def reach(cluster: Cluster, vm: dict, ip: str, timeout: float = 5) -> bool:
    """Reachable within `timeout` (the first packet to a new VTEP is lost while OVS resolves its MAC)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        wait = "1" if vm.get("kind") in ("kvm", "container") else "0.5"  # busybox ping waits whole seconds
        if ex(cluster, vm, "ping", "-c", "1", "-W", wait, ip).returncode == 0:
            return True
    return False


class Capture:
    """tcpdump in a namespace, written to a pcap and read back with scapy."""

    def __init__(self, ns: str | None, iface: str, bpf: str = "", path: Path | None = None) -> None:
        """`ns` None: the root namespace (the underlay segment's ends: see underlay_capture)."""
        self.path = path or Path(f"/tmp/tianji-cap-{uuid.uuid4().hex[:8]}.pcap")
        self.proc = subprocess.Popen([*(["ip", "netns", "exec", ns] if ns else []), "tcpdump", "-U", "-n", "-i",
                                      iface, "-w", str(self.path), *([bpf] if bpf else [])],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 10  # until tcpdump says it listens (its filter attached): on a loaded machine
        assert self.proc.stderr is not None  # that comes well after the pcap file exists
        while (left := deadline - time.time()) > 0 and select.select([self.proc.stderr], [], [], left)[0]:
            if "listening on" in (line := self.proc.stderr.readline()) or not line:
                break
        time.sleep(0.05)

    def packets(self) -> list:
        """What has been written so far (tcpdump -U writes each packet as it comes; a torn last record is skipped)."""
        from scapy.all import PcapReader

        got = []
        try:
            with PcapReader(str(self.path)) as r:
                for pkt in r:
                    got.append(pkt)
        except Exception:  # a record half-written right now: what came before it is complete
            pass
        return got

    def stop(self, until: Callable[[object], bool] | None = None, timeout: float = 5) -> list:
        """Stop after `until` has matched a packet (within `timeout`: a loaded machine delays a forwarded packet by
        more than a fixed sleep), or after a short settle when nothing is awaited."""
        from scapy.all import rdpcap

        if until is not None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not any(until(p) for p in self.packets()):
                time.sleep(0.1)
        time.sleep(0.3)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(5)
        try:
            return list(rdpcap(str(self.path)))
        finally:
            self.path.unlink(missing_ok=True)


def scapy_send(cluster: Cluster, ns: str, code: str) -> None:
    """Run scapy code in a namespace (e.g. a VM sending a forged frame)."""
    prog = "from scapy.all import *\nconf.verb = 0\n" + code
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", prog], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr


# a KVM guest's web server (its busybox httpd), serving NAME at /index.html on PORT: .format(name=..., port=...)
GUEST_WEB = "mkdir -p /tmp/www && echo {name} > /tmp/www/index.html && httpd -p {port} -h /tmp/www"
WEB = """
import http.server, socketserver
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.client_address[0].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.request_queue_size = 2048  # a listen backlog for 1,000 simultaneous clients
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer(("0.0.0.0", %d), H).serve_forever()
"""
UDP_ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("0.0.0.0", %d))
while True:
    d, a = s.recvfrom(2048); s.sendto(("%%s:%%d" %% a).encode(), a)
"""


@pytest.fixture
def internet(cluster):
    """The external host runs an HTTP server that answers with the client address it sees, and UDP echoes."""
    ns = cluster.state.nodes["inet"]["ns"]
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for code in (WEB % 80, UDP_ECHO % 9000, UDP_ECHO % 9001)]
    time.sleep(0.5)
    yield {"ns": ns, "ip": cluster.state.nodes["inet"]["ip"]}
    for p in procs:
        p.kill()


def underlay_capture(cluster, node: str, bpf: str = "") -> Capture:
    """What a node sends and receives on the underlay, captured on the segment's end of its link (the node's own
    ul0 is an AF_XDP port, whose frames packet taps do not see)."""
    from topologies.wiring import underlay_end

    return Capture(None, underlay_end(cluster.state.name, node), bpf)
