"""A three-namespace lab for one NAT gateway: a hypervisor stand-in, the gateway host, and an external server.

    client (kernel VXLAN, VNI 1001, "VM" 10.0.1.5) --veth-- gateway (VTEP 172.30.0.1) --veth-- server 198.51.100.1

The client's kernel VXLAN device plays the vSwitch: it sends the VM's packets to the gateway's VTEP with the VPC's
VNI and router MAC, exactly as OVS does. The gateway is either a tianji instance (standalone, from a config file,
with the fast path under test) or the Linux kernel doing the same work (VXLAN decapsulation, then SNAT to the EIP
with nftables): the baseline. Both see the same packets. Used by bench/gateway.py and the data-plane tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from topologies import netns
from topologies.hosts import read_status
from topologies.machines import GatewayHost
from topologies.netns import sh

VNI = 1001
VM_IP, VM_MAC = "10.0.1.5", "02:00:00:00:01:05"
ROUTER_IP, ROUTER_MAC = "10.0.1.1", "02:00:00:00:01:01"
CLIENT_VTEP, GW_VTEP = "172.30.0.2", "172.30.0.1"
SERVER_IP, EIP = "198.51.100.1", "203.0.113.1"
TIANJI = str(Path(sys.executable).with_name("tianji"))


def stop(proc: subprocess.Popen | None) -> None:
    """Stop a lab instance (its process group): TERM, then KILL if it does not go within 10 s."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(5)


class GatewayLab:
    def __init__(self, prefix: str = "tjgl") -> None:
        self.client, self.gw, self.server = (f"{prefix}c", f"{prefix}g", f"{prefix}s")
        self.proc: subprocess.Popen | None = None
        self.dir = Path(f"/run/tianji-lab/{prefix}")
        self.kind = ""
        self.name = "lab"

    # --- plumbing ----------------------------------------------------------------------------------------------
    def up(self, kind: str, fastpath: str = "auto") -> GatewayLab:
        """kind: 'kernel' (the nftables baseline) or 'tianji' (a gateway instance with `fastpath`)."""
        self.plumb(kind)
        if kind == "kernel":
            self._kernel_gateway()
        else:
            self._tianji_gateway(fastpath)
        return self

    def up_with_controller(self, url_port: int, token: str, fastpath: str = "auto", name: str = "gw1",
                           eips: str = "203.0.113.0/24", role: str = "nat") -> GatewayLab:
        """A gateway instance watching a controller that listens on every address at `url_port` of the root
        namespace (reached over a management veth, 10.250.0.1), EIPs from `eips` on-link at the server."""
        self.plumb("tianji")
        netns.veth(f"{self.gw}m", None, "mgmt0", self.gw)
        netns.address(None, f"{self.gw}m", "10.250.0.1/30")
        netns.address(self.gw, "mgmt0", "10.250.0.2/30")
        sh("ip", "-n", self.server, "route", "add", eips, "dev", "eth0")
        self.name = name
        self._start(fastpath, "--controller", f"http://10.250.0.1:{url_port}", "--token", token, role=role)
        return self

    def _start(self, fastpath: str, *source: str, role: str = "nat") -> None:
        """A tianji gateway instance of `role` on the lab's interfaces; `source`: where its config comes from."""
        self.log = self.dir / "gateway.log"
        host = GatewayHost(self.name, self.gw, f"{GW_VTEP}/24", role)
        cmd = netns.argv(self.gw, *host.command(TIANJI, list(source), self.dir, "--fastpath", fastpath))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def plumb(self, kind: str) -> None:
        """The three namespaces, their links and the client's kernel VXLAN device."""
        self.kind = kind
        self.down()
        self.dir.mkdir(parents=True, exist_ok=True)
        for n in (self.client, self.gw, self.server):
            netns.add(n)
        netns.veth("ul0", self.client, "ul0", self.gw, full_checksums=True)
        netns.veth("ext0", self.gw, "eth0", self.server, full_checksums=True)
        netns.address(self.client, "ul0", f"{CLIENT_VTEP}/24")
        netns.address(self.gw, "ul0", f"{GW_VTEP}/24")
        netns.address(self.server, "eth0", f"{SERVER_IP}/24")
        # the "hypervisor": a kernel VXLAN device with the VM's address, the VPC router's MAC as its gateway
        sh("ip", "-n", self.client, "link", "add", "vx0", "address", VM_MAC, "type", "vxlan", "id", str(VNI),
           "local", CLIENT_VTEP, "remote", GW_VTEP, "dstport", "4789", "nolearning")
        sh("ip", "-n", self.client, "addr", "add", f"{VM_IP}/24", "dev", "vx0")
        sh("ip", "-n", self.client, "link", "set", "vx0", "up")
        sh("ip", "-n", self.client, "neigh", "replace", ROUTER_IP, "lladdr", ROUTER_MAC, "dev", "vx0", "nud",
           "permanent")
        sh("ip", "-n", self.client, "route", "add", "default", "via", ROUTER_IP)
        sh("ip", "-n", self.server, "route", "add", "203.0.113.0/24", "dev", "eth0")  # EIPs are on-link
        # the client's and server's receive work on the cores the gateway's loop leaves free, as on machines of their
        # own: a veth delivers on the transmitter's core, which would put it all on the gateway's (or the router's)
        others = sorted(os.sched_getaffinity(0))[:-1]
        if others:
            mask = f"{sum(1 << c for c in others):x}"
            for ns, dev in ((self.client, "ul0"), (self.server, "eth0")):
                sh("sh", "-c", f"echo {mask} > /sys/class/net/{dev}/queues/rx-0/rps_cpus", ns=ns)

    def _kernel_gateway(self) -> None:
        g = self.gw
        sh("ip", "-n", g, "link", "add", "vx0", "address", ROUTER_MAC, "type", "vxlan", "id", str(VNI), "local",
           GW_VTEP, "remote", CLIENT_VTEP, "dstport", "4789", "nolearning")
        sh("ip", "-n", g, "addr", "add", f"{ROUTER_IP}/24", "dev", "vx0")
        sh("ip", "-n", g, "link", "set", "vx0", "up")
        sh("ip", "-n", g, "neigh", "replace", VM_IP, "lladdr", VM_MAC, "dev", "vx0", "nud", "permanent")
        sh("ip", "-n", g, "addr", "add", f"{EIP}/32", "dev", "ext0")  # the kernel answers ARP for the EIP
        sh("ip", "-n", g, "route", "add", "198.51.100.0/24", "dev", "ext0", "src", EIP)  # on-link, as for tianji
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=g)
        # RPS: the kernel forwards on its own core, as the gateway's loop does, instead of in the sender's softirq
        cpu = max(os.sched_getaffinity(0))
        sh("sh", "-c", f"echo {1 << cpu:x} > /sys/class/net/ul0/queues/rx-0/rps_cpus", ns=g)
        for rule in ("add table ip nat", "add chain ip nat post { type nat hook postrouting priority 100 ; }",
                     f'add rule ip nat post oifname "ext0" snat to {EIP}'):
            sh("nft", rule, ns=g)

    def config(self) -> dict:
        ep = {"port_id": "p1", "vpc_id": "v1", "vni": VNI, "ip": VM_IP, "mac": VM_MAC, "host": "hv",
              "vtep_ip": CLIENT_VTEP}
        return {"name": "lab", "revision": 1, "vtep_ip": GW_VTEP, "eips": [EIP], "endpoints": [ep],
                "vpcs": [{"id": "v1", "vni": VNI, "router_mac": ROUTER_MAC,
                          "snat": [{"cidr": "10.0.0.0/8", "eips": [EIP]}]}],
                "vteps": [{"host": "hv", "ip": CLIENT_VTEP}]}

    def _tianji_gateway(self, fastpath: str) -> None:
        cfg = self.dir / "config.json"
        cfg.write_text(json.dumps(self.config()))
        self._start(fastpath, "--config-file", str(cfg))
        deadline = time.time() + 30
        while time.time() < deadline:
            st = self.status()
            if st.get("revision") == 1:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"lab gateway did not start; log:\n{self.log.read_text()[-2000:]}")

    def status(self) -> dict:
        return read_status(self.dir / f"gateway-{self.name}.json")

    def down(self) -> None:
        stop(self.proc)
        self.proc = None
        (self.dir / f"gateway-{self.name}.json").unlink(missing_ok=True)
        sh("ip", "link", "del", f"{self.gw}m", check=False)
        for n in (self.client, self.gw, self.server):
            sh("ip", "netns", "del", n, check=False)

    def __enter__(self) -> GatewayLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # --- traffic -----------------------------------------------------------------------------------------------
    def exec(self, ns: str, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        r = netns.sh(*cmd, ns=ns, check=False, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{ns}: {' '.join(cmd)}: {r.stdout.strip()} {r.stderr.strip()}")
        return r


__all__ = ["EIP", "GatewayLab", "SERVER_IP", "VM_IP", "VNI"]
