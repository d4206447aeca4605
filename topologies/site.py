"""An on-premise site's edge router, as a customer runs one: FRR (bgpd, bfdd) speaking BGP to the cloud over a
VLAN of its trunk to the gateways' handoff, with a LAN behind it.

This kernel cannot make VLAN devices, so the site tags with a private Open vSwitch (userspace datapath): its trunk
`ho0` on a netdev bridge, and for each line an internal port in that VLAN (an access port, `tag=VLAN`) holding the
customer's address of the link. The LAN is a host namespace (`<site>-lan`, 192.168.10.10 by default) on a veth.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from nfv_gateways.core.frr import FRR, wait_for_path
from topologies import netns
from topologies.cluster_state import State
from topologies.hosts import wait_gone
from topologies.machines import ovs_env, start_private_ovs


@dataclass
class Neighbor:
    address: str  # the cloud's side
    remote_as: int
    password: str | None = None


@dataclass
class SiteRouter:
    st: State
    site: str
    asn: int = 65010
    lan: str = "192.168.10.0/24"
    vlans: dict[int, str] = field(default_factory=dict)  # VLAN -> the customer's ADDRESS/LEN

    @property
    def ns(self) -> str:
        return self.st.nodes[self.site]["ns"]

    @property
    def dir(self) -> Path:
        return Path(self.st.dir) / self.site

    @property
    def lan_ns(self) -> str:
        return f"{self.ns}-lan"

    @property
    def lan_host(self) -> str:
        return str(ipaddress.IPv4Network(self.lan).network_address + 10)

    def vsctl(self, *args: str) -> str:
        return netns.sh("ovs-vsctl", f"--db=unix:{self.dir}/db.sock", *args, ns=self.ns,
                        env=ovs_env(self.dir)).stdout

    def start(self) -> SiteRouter:
        """The trunk's bridge and the LAN (idempotent: a second call finds them)."""
        if (self.dir / "ovs-vswitchd.pid").exists():
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        self.st.pids += start_private_ovs(self.ns, self.dir)
        self.st.save()
        self.vsctl("--may-exist", "add-br", "br-site", "--", "set", "bridge", "br-site", "datapath_type=netdev")
        self.vsctl("--may-exist", "add-port", "br-site", "ho0")
        netns.sh("ethtool", "-K", "ho0", "tx", "off", ns=self.ns, check=False)  # full checksums on the wire
        netns.up(self.ns, "ho0", "br-site")
        self.st.netns.append(self.lan_ns)
        self.st.save()
        netns.add(self.lan_ns)
        netns.veth("lan0", self.ns, "eth0", self.lan_ns)
        net = ipaddress.IPv4Network(self.lan)
        netns.address(self.ns, "lan0", f"{net.network_address + 1}/{net.prefixlen}")
        netns.address(self.lan_ns, "eth0", f"{self.lan_host}/{net.prefixlen}")
        netns.sh("ip", "route", "add", "default", "via", str(net.network_address + 1), ns=self.lan_ns)
        netns.sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=self.ns)
        return self

    def add_vlan(self, vlan: int, address: str) -> None:
        """The customer's end of a line: an access port of VLAN `vlan` with `address` (ADDRESS/LEN)."""
        port = f"v{vlan}"
        self.vsctl("--may-exist", "add-port", "br-site", port, "tag=" + str(vlan), "--", "set", "interface", port,
                   "type=internal")
        deadline = time.monotonic() + 10
        while netns.sh("ip", "link", "show", port, ns=self.ns, check=False).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.site}: OVS did not make {port}")
            time.sleep(0.05)
        netns.sh("ip", "link", "set", port, "mtu", "1500", ns=self.ns)
        netns.sh("ip", "addr", "replace", address, "dev", port, ns=self.ns)  # again: the same line, reconfigured
        netns.up(self.ns, port)
        self.vlans[vlan] = address

    def bgp(self, neighbors: list[Neighbor], networks: list[str] | None = None, extra: list[str] = ()) -> None:
        """(Re)start the site's FRR with these neighbours (with BFD), announcing `networks` (default: its LAN)."""
        self.stop_bgp()
        conf = self.dir / "frr"
        run = Path("/var/run/frr") / self.ns
        conf.mkdir(parents=True, exist_ok=True)
        run.mkdir(parents=True, exist_ok=True)
        lines = [f"hostname {self.site}", "frr defaults datacenter", "!", f"router bgp {self.asn}",
                 " no bgp ebgp-requires-policy", " no bgp network import-check"]
        for n in neighbors:
            lines += [f" neighbor {n.address} remote-as {n.remote_as}", f" neighbor {n.address} bfd",
                      f" neighbor {n.address} timers connect 1"]
            lines += [f" neighbor {n.address} password {n.password}"] if n.password else []
        lines += [" address-family ipv4 unicast", *(f"  network {p}" for p in networks or [self.lan]), *extra,
                  " exit-address-family", "!"]
        (conf / "bgpd.conf").write_text("\n".join(lines) + "\n")
        (conf / "zebra.conf").write_text(f"hostname {self.site}\n!\n")
        (conf / "bfdd.conf").write_text("bfd\n" + "".join(
            f" peer {n.address}\n  receive-interval 300\n  transmit-interval 300\n exit\n" for n in neighbors)
            + "!\n")
        for p in (conf, run, *conf.iterdir()):
            shutil.chown(p, "frr", "frr")
        for d in ("zebra", "bfdd", "bgpd"):
            netns.sh(str(FRR / d), "-d", "-N", self.ns, "-f", str(conf / f"{d}.conf"), "-i", str(conf / f"{d}.pid"),
                     "--log", f"file:{conf / d}.log", ns=self.ns)
            pid = int((conf / f"{d}.pid").read_text().split()[0])
            self.st.pids.append(pid)
            if d == "zebra":
                wait_for_path(run / "zserv.api")
        self.st.save()

    def stop_bgp(self) -> None:
        conf = self.dir / "frr"
        for d in ("bgpd", "bfdd", "zebra"):
            pidfile = conf / f"{d}.pid"
            if pidfile.exists():
                pid = int(pidfile.read_text().split()[0])
                subprocess.run(["kill", str(pid)], capture_output=True, check=False)
                wait_gone(pid, time.time() + 5)
                pidfile.unlink()

    def vtysh(self, cmd: str) -> str:
        return netns.sh("vtysh", "-N", self.ns, "-c", cmd).stdout

    def lan_exec(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return netns.sh(*cmd, ns=self.lan_ns, check=False, timeout=timeout)


__all__ = ["Neighbor", "SiteRouter"]
