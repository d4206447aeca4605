"""The Mininet wiring of the emulated cluster: five segments (underlay, management, external, the private lines'
handoff, the service network), the hypervisors, gateways, the internet, on-premise sites and service hosts, their
links and addresses. Everything made is recorded in the cluster's State as it is made, so `down` removes it even
after a failed bring-up. What then runs on the machines (OVS, agents, VMs) is machines.py's, started by cluster.py.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from topologies.cluster_state import State


def underlay_mtu(topology: dict) -> int:
    """The underlay's MTU: the topology's `underlay_mtu`, else 1500. AF_XDP ports on veths work up to 3500."""
    return int(topology.get("underlay_mtu", 1500))


def quiet_handoff(node: object, segment_end: str) -> None:
    """The handoff carries the lines' tagged frames only: no kernel's own IPv6 (router solicitations, DAD) from
    either end of a link to it, set before the links come up."""
    node.cmd("sysctl", "-q", "-w", "net.ipv6.conf.ho0.disable_ipv6=1")  # type: ignore[attr-defined]
    subprocess.run(["sysctl", "-q", "-w", f"net.ipv6.conf.{segment_end}.disable_ipv6=1"], capture_output=True)


def _handoff_end(st: State, node: str) -> str:
    """A node's link to the handoff, by its end on the segment: removed by name at teardown (a BGP socket left
    retransmitting its FIN keeps a deleted namespace, and its end of the veth, alive for minutes)."""
    end = f"{st.name}{node}h"[:15]
    st.links.append(end)
    return end


def underlay_end(cluster: str, node: str) -> str:
    """The underlay segment's end of a node's ul0 link (in the root namespace, on the underlay bridge): where to
    watch a node's underlay traffic (an AF_XDP port's own end hides it from packet taps)."""
    return f"{cluster}{node}u"[:15]


def wire(st: State, mgmt_net: ipaddress.IPv4Network, eip_pool: str) -> Any:
    """Build the topology in `st.topology`; returns the Mininet object (its shells end with the process)."""
    from mininet.link import Link
    from mininet.net import Mininet

    from topologies.nodes import Segment

    net = Mininet(topo=None, build=False, controller=None, switch=Segment, cleanup=False, autoSetMacs=False,
                  link=Link)
    name = st.name
    # ho: the private lines' handoff, where the sites' tagged links meet the private-line instances
    # sv: the service network, where the cluster's services and the service instances' external side are
    segments = {k: net.addSwitch(f"{name}-{k}", cls=Segment) for k in ("ul", "mg", "ex", "ho", "sv")}
    st.links += [sw.name for sw in segments.values()]
    st.save()
    underlay = ipaddress.IPv4Network(st.topology.get("underlay", "172.31.0.0/24"))
    _hypervisors(net, st, segments, underlay, mgmt_net)
    _other_nodes(net, st, segments, underlay, mgmt_net, eip_pool)
    net.build()
    mtu = str(underlay_mtu(st.topology))
    for sw in segments.values():
        if sw is segments["ul"]:  # both ends of every underlay link, before the bridge takes them
            for intf in sw.intfList():
                if intf.name != "lo":
                    subprocess.run(["ip", "link", "set", intf.name, "mtu", mtu], check=True, capture_output=True)
                    peer = intf.link.intf1 if intf.link.intf2 is intf else intf.link.intf2
                    peer.node.run("ip", "link", "set", peer.name, "mtu", mtu)
        if sw is segments["ho"]:  # a switch puts the tag on the wire: the bridge keeps it in metadata otherwise,
            for intf in sw.intfList():  # which AF_XDP and DPDK cannot see (AF_PACKET can)
                if intf.name != "lo":
                    subprocess.run(["ethtool", "-K", intf.name, "txvlan", "off"], check=True, capture_output=True)
        sw.start([])
    subprocess.run(["ip", "addr", "add", f"{mgmt_net.network_address + 1}/{mgmt_net.prefixlen}", "dev",
                    segments["mg"].name], check=True, capture_output=True)
    return net


def _hypervisors(net: Any, st: State, seg: dict, underlay: ipaddress.IPv4Network,
                 mgmt_net: ipaddress.IPv4Network) -> None:
    """Each hypervisor on the underlay (ul0, its VTEP goes on br-phy) and the management network (mgmt0)."""
    from topologies.nodes import HypervisorNode

    for i, hv_name in enumerate(st.topology["hypervisors"], start=1):
        ns = f"{st.name}-{hv_name}"
        st.netns.append(ns)
        st.save()
        hv = net.addHost(hv_name, cls=HypervisorNode, nsname=ns, ip=None)
        net.addLink(hv, seg["ul"], intfName1="ul0", intfName2=underlay_end(st.name, hv_name))
        net.addLink(hv, seg["mg"], intfName1="mgmt0", intfName2=f"{st.name}{hv_name}m"[:15])
        mgmt_ip = mgmt_net.network_address + 10 + i
        hv.run("ip", "addr", "add", f"{mgmt_ip}/{mgmt_net.prefixlen}", "dev", "mgmt0")
        hv.run("ip", "link", "set", "mgmt0", "up")
        hv.run("ip", "link", "set", "ul0", "up")
        st.hypervisors[hv_name] = {"ns": ns, "rundir": str(Path(st.dir) / hv_name),
                                   "vtep": f"{underlay.network_address + 10 + i}/{underlay.prefixlen}",
                                   "controller_ip": str(mgmt_net.network_address + 1), "agent_pid": None,
                                   "mgmt_ip": str(mgmt_ip)}


def _other_nodes(net: Any, st: State, seg: dict, underlay: ipaddress.IPv4Network,
                 mgmt_net: ipaddress.IPv4Network, eip_pool: str) -> None:
    from topologies.nodes import ExternalNode, GatewayNode, OnPremNode

    topo = st.topology
    lbs, lines, svcs = topo.get("lb_gateways", []), topo.get("line_gateways", []), topo.get("service_gateways", [])
    service_hosts = topo.get("service_hosts", {})
    service_net = ipaddress.IPv4Network(topo.get("service_network", "100.100.0.0/16"))
    for role, cls_, names in (("gateway", GatewayNode, topo.get("gateways", []) + lbs + lines + svcs),
                              ("external", ExternalNode, topo.get("external", [])),
                              ("onprem", OnPremNode, topo.get("onprem", [])),
                              ("service-host", ExternalNode, list(service_hosts))):
        for j, n in enumerate(names, start=1):
            ns = f"{st.name}-{n}"
            st.netns.append(ns)
            node = net.addHost(n, cls=cls_, nsname=ns, ip=None)
            info: dict = {"ns": ns, "role": role}
            if role == "gateway":
                info["gateway_role"] = "lb" if n in lbs else "private-line" if n in lines else \
                    "service" if n in svcs else "nat"
                net.addLink(node, seg["ul"], intfName1="ul0", intfName2=underlay_end(st.name, n))
                if n in lines:
                    net.addLink(node, seg["ho"], intfName1="ho0", intfName2=(end := _handoff_end(st, n)))
                    quiet_handoff(node, end)
                elif n in svcs:  # its external side is the service network
                    net.addLink(node, seg["sv"], intfName1="ext0", intfName2=f"{st.name}{n}s"[:15])
                else:
                    net.addLink(node, seg["ex"], intfName1="ext0", intfName2=f"{st.name}{n}x"[:15])
                net.addLink(node, seg["mg"], intfName1="mgmt0", intfName2=f"{st.name}{n}m"[:15])
                addr = f"{underlay.network_address + 100 + j}/{underlay.prefixlen}"
                node.run("ip", "addr", "add", addr, "dev", "ul0")
                mgmt_ip = mgmt_net.network_address + 100 + j
                node.run("ip", "addr", "add", f"{mgmt_ip}/{mgmt_net.prefixlen}", "dev", "mgmt0")
                # full checksums on the wire: the hypervisors' userspace datapath (and the gateway's own
                # packet socket) cannot complete a veth's offloaded partial checksum
                node.run("ethtool", "-K", "ul0", "tx", "off")
                info["underlay_ip"] = addr
            elif role == "onprem":  # the site's router's trunk to the handoff (topologies/site.py tags it)
                net.addLink(node, seg["ho"], intfName1="ho0", intfName2=(end := _handoff_end(st, n)))
                quiet_handoff(node, end)
            elif role == "external":
                net.addLink(node, seg["ex"], intfName1="eth0", intfName2=f"{st.name}{n}x"[:15])
                node.run("ip", "addr", "add", f"198.51.100.{j}/24", "dev", "eth0")
                node.run("ip", "link", "set", "eth0", "up")
                node.run("ethtool", "-K", "eth0", "tx", "off")  # full checksums (see the gateway's ul0)
                node.run("ip", "route", "add", eip_pool, "dev", "eth0")  # the EIPs are on this segment
                info["ip"] = f"198.51.100.{j}"
            elif role == "service-host":  # the cluster's services, on the service network (no route elsewhere)
                net.addLink(node, seg["sv"], intfName1="eth0", intfName2=f"{st.name}{n}s"[:15])
                for a in sorted({x.rsplit(":", 1)[0] for x in service_hosts[n].values()}):
                    node.run("ip", "addr", "add", f"{a}/{service_net.prefixlen}", "dev", "eth0")
                node.run("ip", "link", "set", "eth0", "up")
                node.run("ethtool", "-K", "eth0", "tx", "off")  # full checksums (see the gateway's ul0)
                info["services"] = dict(service_hosts[n])  # kind (store, db) -> ADDRESS:PORT
            for intf in node.intfList():
                node.run("ip", "link", "set", intf.name, "up", check=False)
            st.nodes[n] = info
            st.save()

