"""The cluster's edge router, as an operator runs one above the gateways: FRR (bgpd, bfdd) on the external segment
learning the public addresses the NAT and load-balancer instances announce (host routes, BGP with BFD), ECMP
across the instances that announce one (the kernel's multipath routes, hashed on the 5-tuple), and a host of the
internet behind it (`<cluster>-inet2`, 192.0.2.10) that reaches the cloud only through those routes.

The router takes its own namespaces and links (made and removed here, recorded in the cluster's state for its
teardown), so the flat segment's internet host and ARP homing stay as they are for everything else."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from nfv_gateways.core.frr import BFD_MS, BFD_MULT, FRR, wait_for_path
from topologies import netns
from topologies.cluster_state import State
from topologies.hosts import wait_gone

ROUTER_IP = "198.51.100.254"  # on the external segment
INTERNET_NET, INTERNET_HOST = "192.0.2.0/24", "192.0.2.10"
EDGE_ASN, CLOUD_ASN = 64600, 64512


def speaker_address(index: int) -> str:
    """A gateway instance's address on the external segment for its BGP speaker (the n-th instance)."""
    return f"198.51.100.{200 + index}/24"


@dataclass
class EdgeRouter:
    st: State

    @property
    def ns(self) -> str:
        return f"{self.st.name}-edge"

    @property
    def inet_ns(self) -> str:
        return f"{self.st.name}-inet2"

    @property
    def dir(self) -> Path:
        return Path(self.st.dir) / "edge"

    def start(self) -> EdgeRouter:
        """The router on the external segment, the internet host behind it, and FRR (idempotent)."""
        if (self.dir / "bgpd.pid").exists():
            return self
        end = f"{self.st.name}edgx"[:15]
        self.st.netns += [self.ns, self.inet_ns]
        self.st.links.append(end)
        self.st.save()
        netns.add(self.ns)
        netns.add(self.inet_ns)
        netns.veth(end, None, "eth0", self.ns, full_checksums=True)
        netns.sh("ip", "link", "set", end, "master", f"{self.st.name}-ex", "up")
        netns.address(self.ns, "eth0", f"{ROUTER_IP}/24")
        netns.veth("eth1", self.ns, "eth0", self.inet_ns, full_checksums=True)
        netns.address(self.ns, "eth1", "192.0.2.1/24")
        netns.address(self.inet_ns, "eth0", f"{INTERNET_HOST}/24")
        netns.sh("ip", "route", "add", "default", "via", "192.0.2.1", ns=self.inet_ns)
        for k in ("net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1"):  # ECMP on the 5-tuple
            netns.sh("sysctl", "-qw", k, ns=self.ns)
        self._frr()
        return self

    def _frr(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        run = Path("/var/run/frr") / self.ns
        run.mkdir(parents=True, exist_ok=True)
        confs = {
            "zebra": "hostname edge\n!\n",
            "bfdd": f"bfd\n profile gws\n  receive-interval {BFD_MS}\n  transmit-interval {BFD_MS}\n"
                    f"  detect-multiplier {BFD_MULT}\n exit\n!\n",
            "bgpd": "\n".join([
                "hostname edge", "frr defaults datacenter", "!", f"router bgp {EDGE_ASN}",
                f" bgp router-id {ROUTER_IP}", " no bgp ebgp-requires-policy",
                " neighbor gws peer-group", f" neighbor gws remote-as {CLOUD_ASN}", " neighbor gws bfd",
                " neighbor gws bfd profile gws", " bgp listen range 198.51.100.0/24 peer-group gws",
                " address-family ipv4 unicast", "  maximum-paths 16", " exit-address-family", "!"]) + "\n"}
        for d, text in confs.items():
            (self.dir / f"{d}.conf").write_text(text)
        for p in (self.dir, run, *self.dir.iterdir()):
            shutil.chown(p, "frr", "frr")
        for d in ("zebra", "bfdd", "bgpd"):
            netns.sh(str(FRR / d), "-d", "-N", self.ns, "-f", str(self.dir / f"{d}.conf"), "-i",
                     str(self.dir / f"{d}.pid"), "--log", f"file:{self.dir / d}.log", ns=self.ns)
            self.st.pids.append(int((self.dir / f"{d}.pid").read_text().split()[0]))
            if d == "zebra":
                wait_for_path(run / "zserv.api")
        self.st.save()

    def stop(self) -> None:
        for d in ("bgpd", "bfdd", "zebra"):
            pidfile = self.dir / f"{d}.pid"
            if pidfile.exists():
                pid = int(pidfile.read_text().split()[0])
                subprocess.run(["kill", str(pid)], capture_output=True, check=False)
                wait_gone(pid, time.time() + 5)
                pidfile.unlink()

    def nexthops(self, address: str) -> set[str]:
        """The speakers the router sends `address` to (its kernel's route: one next hop, or several: ECMP)."""
        r = subprocess.run(["ip", "-n", self.ns, "-j", "route", "show", f"{address}/32", "proto", "bgp"],
                           capture_output=True, text=True)
        hops: set[str] = set()
        for route in json.loads(r.stdout or "[]"):
            hops |= {h["gateway"] for h in route.get("nexthops", [])} | ({route["gateway"]} if "gateway" in route
                                                                          else set())
        return hops

    def inet_exec(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return netns.sh(*cmd, ns=self.inet_ns, check=False, timeout=timeout)


__all__ = ["CLOUD_ASN", "EDGE_ASN", "INTERNET_HOST", "EdgeRouter", "ROUTER_IP", "speaker_address"]
