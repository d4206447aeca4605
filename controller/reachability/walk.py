"""A packet's walk across the cluster: from a VM's port through its host's switch, over VXLAN to the next host's
switch or to a gateway instance, until it is delivered, dropped or leaves; then the reply, back the same way
(conntrack on every switch remembers the request).

Each hypervisor's switch is the agent's own flows for that host's compiled config run in the OpenFlow model
(vswitch_agent.model_host); a gateway instance is read from its compiled config (gateway_hop.py). `Cluster` is
where configs come from (the database, in api/reachability.py; plain dicts in tests).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Protocol

from controller.reachability.explain import Step, explain
from controller.reachability.gateway_hop import gateway_steps
from tianji.southbound import DEFAULT_GATEWAY_ROLE, GatewayConfig, HostConfig, PortInfo
from vswitch_agent.flows6 import link_local
from vswitch_agent.model_host import TUNNEL_OFPORT, ModelHost, arp_request, nd_solicitation, pruned
from vswitch_agent.ofmodel import CONTROLLER

PROTOCOLS = {"tcp": 6, "udp": 17, "icmp": 1}
PROTOCOLS6 = {"tcp": 6, "udp": 17, "icmp": 58}
MAX_HOPS = 8  # VM -> host -> host (peering) -> gateway ... -> host: more is a loop
EPHEMERAL_PORT = 40000


class Cluster(Protocol):
    def host_config(self, host: str) -> HostConfig | None: ...
    def host_at(self, vtep_ip: str) -> tuple[str, str, str | None] | None: ...  # (name, kind, role)
    def gateway_config(self, name: str) -> GatewayConfig | None: ...
    def vni_tenant(self, vni: int) -> str | None: ...  # whose VPC has this VNI


@dataclass
class Hop:
    host: str
    kind: str  # hypervisor | gateway
    role: str | None = None  # a gateway's
    vni: int | None = None  # the VNI it arrived in over VXLAN (None: from a local VM)
    steps: list[Step] = field(default_factory=list)
    tenant_id: str | None = None  # whose VPC the packet is in here (the API hides another tenant's hop)


@dataclass
class Leg:
    """One direction's walk: where it ended (`end`: delivered, left, answered, dropped) and why (`reason`, in the
    words of `tenant_id`'s configuration: the API hides another tenant's)."""

    hops: list[Hop]
    end: str
    reason: str
    tenant_id: str | None = None
    port_id: str | None = None  # delivered to this port
    packet: dict | None = None  # as delivered
    first: tuple[str, ...] | None = None  # where the first switch sends it (reachability/live.py compares it)
    sent: dict | None = None  # the frame the VM sent (what the live trace asks the switch about)


class Walk:
    """One question's walk: the switches it builds stay (with their conntrack) for the reply."""

    def __init__(self, cluster: Cluster, addresses: set[str]) -> None:
        self.cluster = cluster
        self.addresses = addresses
        self.models: dict[str, ModelHost | None] = {}

    def model(self, host: str) -> ModelHost | None:
        if host not in self.models:
            cfg = self.cluster.host_config(host)
            self.models[host] = None if cfg is None else ModelHost(pruned(cfg, self.addresses))
        return self.models[host]

    def send(self, host: str, port: PortInfo, dst_ip: str, proto: str, sport: int, dport: int | None) -> Leg:
        """A VM's packet: it ARPs for its next hop (the destination on its subnet, else its gateway), then sends."""
        m = self.model(host)
        if m is None or port.id not in m.ofports:
            return Leg([], "dropped", f"port {port.id} is not on host {host}'s switch")
        vpc = next(v for v in m.cfg.vpcs if v.id == port.vpc_id)
        tenant = vpc.tenant_id
        subnet = next(s for s in vpc.subnets if s.id == port.subnet_id)
        v6 = ":" in dst_ip
        if v6 and (port.ipv6 is None or subnet.ipv6_cidr is None):
            return Leg([], "dropped", f"{dst_ip} is IPv6 and port {port.id} has no IPv6 address", tenant)
        on_link = ipaddress.ip_address(dst_ip) in ipaddress.ip_network(subnet.ipv6_cidr if v6 else subnet.cidr)
        # off-link, a VM sends to its router: the advertising router's link-local address (IPv6), the gateway (IPv4)
        target = dst_ip if on_link else link_local(vpc.router_mac) if v6 else subnet.gateway_ip
        src = port.ipv6 if v6 else port.ip
        mac = m.nd(port.id, port.mac, src, target) if v6 else m.arp(port.id, port.mac, port.ip, target)
        ask = "neighbour solicitation" if v6 else "ARP"
        if mac is None:
            why = (f"no port in subnet {subnet.ipv6_cidr if v6 else subnet.cidr} has address {dst_ip}" if on_link
                   else f"the subnet's router {target} did not answer")
            sent = nd_solicitation(port.mac, src, target) if v6 else arp_request(port.mac, port.ip, target)
            return Leg([Hop(host, "hypervisor", steps=explain(m), tenant_id=tenant)], "dropped",
                       f"{ask} for {target} is not answered: {why}", tenant, first=("dropped",), sent=sent)
        table = "nd_responder" if v6 else "arp_responder"
        arp = Step(table, f"{ask} for {target} answered by the switch: {mac}", tenant_id=tenant)
        hop = Hop(host, "hypervisor", steps=[arp], tenant_id=tenant)
        pkt = packet(port.mac, mac, src, dst_ip, proto, sport, dport)
        leg = self.follow(host, m.from_port(port.id, pkt), hop, [])
        leg.sent = pkt
        return leg

    def follow(self, host: str, outs: list, hop: Hop, hops: list[Hop]) -> Leg:
        first = _first(self.models[host], outs)
        leg = self._follow(host, outs, hop, hops)
        leg.first = first
        return leg

    def _follow(self, host: str, outs: list, hop: Hop, hops: list[Hop]) -> Leg:
        for _ in range(MAX_HOPS):
            m = self.models[host]
            assert m is not None
            hop.steps += explain(m)
            hops.append(hop)
            if not outs:
                last = hop.steps[-1] if hop.steps else Step("", "dropped", tenant_id=hop.tenant_id)
                return Leg(hops, "dropped", last.does, last.tenant_id)
            where, pkt = outs[0]
            if where == CONTROLLER:
                return Leg(hops, "answered", f"answered by the agent on {host} (the VPC's DHCP or DNS)", hop.tenant_id)
            if where != TUNNEL_OFPORT:
                pid = m.where(where)
                owner = next((v.tenant_id for p in m.cfg.ports if p.id == pid for v in m.cfg.vpcs
                              if v.id == p.vpc_id), hop.tenant_id)
                return Leg(hops, "delivered", f"delivered to port {pid} on {host}", owner, pid, pkt)
            vni_tenant = self.cluster.vni_tenant(pkt["tunnel_id"])
            nxt = self.cluster.host_at(pkt["tun_ipv4_dst"])
            if nxt is None:
                return Leg(hops, "dropped", f"tunnelled to {pkt['tun_ipv4_dst']}, which is no registered host",
                           vni_tenant)
            name, kind, role = nxt
            if kind != "hypervisor":
                return self.gateway(name, role, pkt, hops)
            m2 = self.model(name)
            if m2 is None:
                return Leg(hops, "dropped", f"host {name} has no config", vni_tenant)
            outs = m2.from_tunnel(pkt, m.cfg.vtep_ip or "")
            host, hop = name, Hop(name, "hypervisor", vni=pkt["tunnel_id"], tenant_id=vni_tenant)
        return Leg(hops, "dropped", f"more than {MAX_HOPS} hops: a loop")

    def gateway(self, name: str, role: str | None, pkt: dict, hops: list[Hop]) -> Leg:
        cfg = self.cluster.gateway_config(name)
        role = role or DEFAULT_GATEWAY_ROLE
        tenant = self.cluster.vni_tenant(pkt["tunnel_id"])
        hop = Hop(name, "gateway", role, pkt["tunnel_id"], tenant_id=tenant)
        hops.append(hop)
        if cfg is None:
            return Leg(hops, "dropped", f"gateway instance {name} has no config", tenant)
        hop.steps, end, reason = gateway_steps(cfg, role, pkt)
        for x in hop.steps:  # the instance applies the configuration of the VPC of the VNI it took in
            x.tenant_id = x.tenant_id or tenant
        return Leg(hops, end, reason, tenant, packet=pkt)


def _first(m: ModelHost | None, outs: list) -> tuple[str, ...]:
    if m is None or not outs:
        return ("dropped",)
    where, pkt = outs[0]
    if where == CONTROLLER:
        return ("controller",)
    if where == TUNNEL_OFPORT:
        return ("tunnel", pkt["tun_ipv4_dst"])
    return ("port", m.where(where))


def packet(src_mac: str, dst_mac: str, src: str, dst: str, proto: str, sport: int, dport: int | None) -> dict:
    """A VM's frame, IPv4 or IPv6 by the addresses' family."""
    ip = "ipv6" if ":" in dst else "ipv4"
    pkt = {"eth_src": src_mac, "eth_dst": dst_mac, "eth_type": 0x86DD if ip == "ipv6" else 0x0800,
           f"{ip}_src": src, f"{ip}_dst": dst, "ip_proto": (PROTOCOLS6 if ip == "ipv6" else PROTOCOLS)[proto],
           "ttl": 64}
    if proto in ("tcp", "udp"):
        pkt |= {f"{proto}_src": sport, f"{proto}_dst": dport or 0}
    elif ip == "ipv6":
        pkt |= {"icmpv6_type": 128, "icmpv6_code": 0}
    else:
        pkt |= {"icmp_type": 8, "icmp_code": 0}
    return pkt
