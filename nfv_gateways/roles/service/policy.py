"""A service endpoint's policy as the instance holds it, typed from the controller's wire form
(ServiceEndpointServed) for the packet stage (`reference.ServiceTable`)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from nfv_gateways.core.packet import PROTO_ICMP, PROTO_TCP, PROTO_UDP, ip2int
from tianji.served import ServiceEndpointServed, ServiceRuleServed

PROTO = {"tcp": PROTO_TCP, "udp": PROTO_UDP, "icmp": PROTO_ICMP, "any": 0}


@dataclass(frozen=True)
class Rule:
    """An ingress rule of the endpoint's groups: protocol (0: any), destination ports, source blocks."""

    proto: int
    port_min: int
    port_max: int
    blocks: tuple[tuple[int, int], ...]  # (network, mask)

    def allows(self, proto: int, src: int, dport: int) -> bool:
        if self.proto and self.proto != proto:
            return False
        if proto in (PROTO_TCP, PROTO_UDP) and not self.port_min <= dport <= self.port_max:
            return False
        return any(src & mask == net for net, mask in self.blocks)


@dataclass(frozen=True)
class EndpointPolicy:
    """What one endpoint does: its address `ip` in VNI `vni`, the service's `addresses` and (protocol, port)s, its
    own `source` on the service network (or in a published load balancer's VNI `via_vni`), whether TCP streams
    begin with a PROXY v2 header."""

    id: str
    vni: int
    ip: int
    source: int
    addresses: tuple[int, ...]
    ports: frozenset[tuple[int, int]]
    proxy_protocol: bool
    rules: tuple[Rule, ...]
    mtu: int
    via_vni: int = 0  # a published load balancer's VNI (its VIP is `addresses`, `source` a port there); 0: outside
    peers: tuple[tuple[int, int, int], ...] = ()  # (network, mask, VNI) of the VPCs peered with the endpoint's

    def back_vni(self, src: int) -> int:
        """The VNI a VM's replies go back in: a peer's when the VM is in a peered VPC (its vSwitch tunnelled with
        the endpoint VPC's VNI, as distributed peering does), else the endpoint's."""
        return next((vni for net, mask, vni in self.peers if src & mask == net), self.vni)

    def admits(self, proto: int, src: int, dport: int) -> bool:
        return any(r.allows(proto, src, dport) for r in self.rules)

    def serves(self, proto: int, port: int) -> bool:
        """A published load balancer's listeners decide (it drops what is for none); else the service's ports."""
        return (proto, port) in self.ports or (self.via_vni != 0 and proto in (PROTO_TCP, PROTO_UDP))


def rule_of(r: ServiceRuleServed) -> Rule:
    blocks = tuple((int(n.network_address), int(n.netmask))
                   for n in (ipaddress.IPv4Network(c, strict=False) for c in r.cidrs))
    return Rule(PROTO[r.protocol], r.port_min or 0, r.port_max if r.port_max is not None else 65535, blocks)


def endpoint_of(x: ServiceEndpointServed) -> EndpointPolicy:
    return EndpointPolicy(x.id, x.vni, ip2int(x.ip), ip2int(x.source), tuple(ip2int(a) for a in x.addresses),
                          frozenset((PROTO[p.protocol], p.port) for p in x.ports), x.proxy_protocol,
                          tuple(rule_of(r) for r in x.rules), x.mtu, x.via_vni,
                          tuple((int(n.network_address), int(n.netmask), p.vni)
                                for p in x.peers for n in (ipaddress.IPv4Network(p.cidr, strict=False),)))


__all__ = ["EndpointPolicy", "Rule", "endpoint_of"]
