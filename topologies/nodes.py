"""Mininet node classes for the roles of a cloud: the namespaces and links; what runs on a hypervisor or a VM is
the one machine model in machines.py, shared with the plain fabric (hosts.py).

Every node lives in a *named* network namespace (`ip netns`), so the cluster outlives the `tianji cluster up`
process and later commands (`tianji cluster vm add`, tests, `down`) can reach it by name. Mininet still
creates the shells and the links (veth pairs) between nodes.

  HypervisorNode  a hypervisor (its OVS and agent: machines.Hypervisor)
  VmNode          a VM (plugged, configured and addressed: machines.Vm)
  GatewayNode     a gateway host on the underlay (NFV gateways come with their issues)
  ExternalNode    "the internet"
  OnPremNode      an on-premise site (private line, later issues)
  Segment         a Linux bridge in the root namespace: the underlay segment and the management network
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mininet.node import Host, Switch

from topologies import netns


def netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


class NamespaceNode(Host):
    """A Mininet host whose shell runs in a named namespace, created if missing (or joined if it exists)."""

    def __init__(self, name: str, nsname: str | None = None, **params) -> None:
        self.nsname = nsname or name
        super().__init__(name, inNamespace=True, **params)

    def startShell(self, mnopts: str | None = None) -> None:  # Mininet's API
        if not netns_exists(self.nsname):
            netns.add(self.nsname)
        self.inNamespace = False  # the named namespace is entered by `ip netns exec`, not by mnexec -n
        try:
            super().startShell(mnopts)
        finally:
            self.inNamespace = True

    def _popen(self, cmd: list[str], **params) -> subprocess.Popen:
        if cmd and cmd[0] == "mnexec" and not self.shell:
            cmd = netns.argv(self.nsname, *cmd)
        return super()._popen(cmd, **params)

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a command in this node's namespace without going through the Mininet shell."""
        r = netns.sh(*cmd, ns=self.nsname, check=False, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{self.name}: {' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
        return r


class HypervisorNode(NamespaceNode):
    """A hypervisor's namespace and links; what runs on it (OVS, the agent) is machines.Hypervisor's."""


class VmNode(NamespaceNode):
    """A VM's namespace; eth0 is one end of a veth whose other end is plugged into the hypervisor's br-int
    (machines.Vm configures, plugs and addresses it)."""


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
