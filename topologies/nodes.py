"""Mininet node classes for the roles of a cloud.

Every node lives in a *named* network namespace (`ip netns`), so the cluster outlives the `tianji cluster up`
process and later commands (`tianji cluster vm add`, tests, `down`) can reach it by name. Mininet still
creates the shells and the links (veth pairs) between nodes.

  HypervisorNode  private ovsdb-server + ovs-vswitchd (userspace datapath, own run directory), br-phy holding
                  the underlay NIC and the VTEP IP, and a `tianji agent`
  VmNode          a VM: plugged into its hypervisor's br-int by a veth carrying external_ids:iface-id, MTU 1450,
                  TX checksum offload off, addressed by DHCP from the agent (or statically)
  GatewayNode     a gateway host on the underlay (NFV gateways come with their issues)
  ExternalNode    "the internet"
  OnPremNode      an on-premise site (private line, later issues)
  Segment         a Linux bridge in the root namespace: the underlay segment and the management network
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from mininet.node import Host, Switch


def netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


class NamespaceNode(Host):
    """A Mininet host whose shell runs in a named namespace, created if missing (or joined if it exists)."""

    def __init__(self, name: str, nsname: str | None = None, **params) -> None:
        self.nsname = nsname or name
        super().__init__(name, inNamespace=True, **params)

    def startShell(self, mnopts: str | None = None) -> None:  # Mininet's API
        if not netns_exists(self.nsname):
            subprocess.run(["ip", "netns", "add", self.nsname], check=True)
            subprocess.run(["ip", "-n", self.nsname, "link", "set", "lo", "up"], check=True)
        self.inNamespace = False  # the named namespace is entered by `ip netns exec`, not by mnexec -n
        try:
            super().startShell(mnopts)
        finally:
            self.inNamespace = True

    def _popen(self, cmd: list[str], **params) -> subprocess.Popen:
        if cmd and cmd[0] == "mnexec" and not self.shell:
            cmd = ["ip", "netns", "exec", self.nsname, *cmd]
        return super()._popen(cmd, **params)

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a command in this node's namespace without going through the Mininet shell."""
        r = subprocess.run(["ip", "netns", "exec", self.nsname, *cmd], capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{self.name}: {' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
        return r


class HypervisorNode(NamespaceNode):
    """A hypervisor: its own Open vSwitch and its own tianji agent."""

    def start_ovs(self, rundir: Path) -> list[int]:
        from topologies.hosts import start_private_ovs

        self.rundir = rundir
        return start_private_ovs(self.nsname, rundir)

    def start_agent(self, tianji: str, controller: str, token: str, vtep: str, underlay_if: str,
                    state_dir: Path, log: Path) -> int:
        cmd = ["ip", "netns", "exec", self.nsname, tianji, "agent", "--host", self.name, "--controller", controller,
               "--token", token, "--vtep-ip", vtep, "--underlay-if", underlay_if, "--ovs-rundir", str(self.rundir),
               "--state-dir", str(state_dir)]
        with open(log, "ab") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        return p.pid

    def vsctl(self, *args: str) -> str:
        return self.run("ovs-vsctl", f"--db=unix:{self.rundir}/db.sock", *args).stdout

    def ofctl(self, *args: str) -> str:
        env = os.environ | {"OVS_RUNDIR": str(self.rundir)}
        r = subprocess.run(["ip", "netns", "exec", self.nsname, "ovs-ofctl", "-O", "OpenFlow13", *args],
                           capture_output=True, text=True, env=env, check=True)
        return r.stdout


class VmNode(NamespaceNode):
    """A VM: eth0 is one end of a veth whose other end is plugged into the hypervisor's br-int."""

    def prepare(self, mac: str) -> None:
        self.run("ip", "link", "set", "eth0", "address", mac)
        self.run("ip", "link", "set", "eth0", "mtu", "1450", "up")
        self.run("ethtool", "-K", "eth0", "tx", "off")

    def dhcp(self, lease_dir: Path) -> None:
        self.run("dhclient", "-1", "-4", "-lf", str(lease_dir / f"{self.name}.leases"),
                 "-pf", str(lease_dir / f"{self.name}.dhclient.pid"), "eth0", timeout=30)

    def static(self, ip: str, prefixlen: int, gateway: str) -> None:
        self.run("ip", "addr", "add", f"{ip}/{prefixlen}", "dev", "eth0")
        self.run("ip", "route", "add", "default", "via", gateway)


class GatewayNode(NamespaceNode):
    """A gateway host on the underlay: the NFV gateways will run here."""


class ExternalNode(NamespaceNode):
    """The internet, as seen from the cluster."""


class OnPremNode(NamespaceNode):
    """An on-premise site."""


class Segment(Switch):
    """A Linux bridge in the root namespace. No OVS needed: the underlay is plain L2."""

    def __init__(self, name: str, **params) -> None:
        params["inNamespace"] = False
        params.setdefault("dpid", "1")  # unused: a bridge has no datapath id, but Mininet wants one
        super().__init__(name, **params)

    def start(self, _controllers: list) -> None:
        subprocess.run(["ip", "link", "add", "name", self.name, "type", "bridge"], check=False)
        subprocess.run(["ip", "link", "set", self.name, "up"], check=True)
        for intf in self.intfList():
            if intf.name != "lo":
                subprocess.run(["ip", "link", "set", intf.name, "master", self.name, "up"], check=True)

    def stop(self, deleteIntfs: bool = True) -> None:  # Mininet's API
        subprocess.run(["ip", "link", "del", self.name], check=False)
        super().stop(deleteIntfs)
