"""What the CNI plugin does on the host: the container's veth (its end named and addressed inside the container's
network namespace, the other end on the host), plugged into the integration bridge by `iface-id` exactly as a VM's
tap is (the agent then programs the port), and unplugged again."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from tianji import netns


class PlumbingError(Exception):
    pass


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode:
        raise PlumbingError(f"{' '.join(cmd)}: {(r.stderr or r.stdout).strip()}")
    return r


@dataclass(frozen=True)
class Host:
    """Where the integration bridge is: its OVSDB (`ovs_rundir`) and, on an emulated hypervisor, the network
    namespace that stands for the host (`netns`; none on a real host)."""

    bridge: str = "br-int"
    ovs_rundir: str = "/var/run/openvswitch"
    netns: str | None = None

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run(*netns.argv(self.netns, "ip", *args), check=check)

    def vsctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ovs-vsctl", f"--db=unix:{self.ovs_rundir}/db.sock", "--timeout=10", *args, check=check)

    def userspace_datapath(self) -> bool:
        """The bridge forwards in userspace (`netdev`): it does not complete a veth's partial checksums, so the
        container's end must compute its own."""
        r = self.vsctl("get", "Bridge", self.bridge, "datapath_type", check=False)
        return r.returncode == 0 and r.stdout.strip().strip('"') == "netdev"


def host_end(port_id: str) -> str:
    return f"tc{port_id[:11]}"  # 13 characters: interface names stop at 15


def in_container(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("nsenter", f"--net={netns}", *args, check=check)


def plug(host: Host, netns: str, ifname: str, port: dict, prefixlen: int, gateway: str, mtu: int,
         routes: list[tuple[str, str]]) -> str:
    """The container's `ifname` with the port's MAC, address, MTU and routes; the host end on the bridge with the
    port's iface-id. Made again from scratch if a half-made one is there (an ADD retried)."""
    hv, tmp = host_end(port["id"]), f"tn{port['id'][:11]}"
    unplug(host, port["id"])
    host.ip("link", "add", hv, "mtu", str(mtu), "type", "veth", "peer", "name", tmp, "mtu", str(mtu))
    try:
        host.ip("link", "set", tmp, "netns", netns)
        in_container(netns, "ip", "link", "set", tmp, "name", ifname)
        in_container(netns, "ip", "link", "set", ifname, "address", port["mac"])
        if host.userspace_datapath():
            in_container(netns, "ethtool", "-K", ifname, "tx", "off")
        in_container(netns, "ip", "addr", "add", f"{port['ip']}/{prefixlen}", "dev", ifname)
        in_container(netns, "ip", "link", "set", ifname, "up")
        for dst, via in routes:
            in_container(netns, "ip", "route", "replace", dst, "via", via, "dev", ifname)
        host.ip("link", "set", hv, "up")
        host.vsctl("--may-exist", "add-port", host.bridge, hv, "--", "set", "Interface", hv,
                   f"external_ids:iface-id={port['id']}", f"external_ids:attached-mac={port['mac']}",
                   "external_ids:iface-status=active", "external_ids:tianji-cni=true")
    except PlumbingError:
        unplug(host, port["id"])
        raise
    return hv


def unplug(host: Host, port_id: str) -> None:
    """The bridge's port and the veth (deleting one end deletes both); nothing if already gone."""
    hv = host_end(port_id)
    host.vsctl("--if-exists", "del-port", host.bridge, hv, check=False)
    host.ip("link", "del", hv, check=False)


def check(host: Host, netns: str, ifname: str, port: dict, prefixlen: int) -> list[str]:
    """What differs from what ADD made: empty when the interface, its address and its binding are as they were."""
    wrong = []
    r = in_container(netns, "ip", "-o", "addr", "show", "dev", ifname, check=False)
    if r.returncode:
        return [f"no interface {ifname} in {netns}"]
    if f"{port['ip']}/{prefixlen}" not in r.stdout:
        wrong.append(f"{ifname} does not hold {port['ip']}/{prefixlen}")
    link = in_container(netns, "ip", "-o", "link", "show", "dev", ifname, check=False).stdout
    if port["mac"] not in link:
        wrong.append(f"{ifname}'s MAC is not {port['mac']}")
    hv = host_end(port["id"])
    got = host.vsctl("get", "Interface", hv, "external_ids:iface-id", check=False)
    if got.returncode or got.stdout.strip().strip('"') != port["id"]:
        wrong.append(f"{hv} is not on {host.bridge} with iface-id {port['id']}")
    return wrong
