"""A config as the instance holds it: one `VpcParts` per VPC section (built once per section received, so that an
apply costs the sections that changed, not the 1,000 others), and the forwarding view the packet path reads
(endpoints, router MACs, VTEPs, the addresses homed here)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field

from nfv_gateways.core.packet import ip2int
from nfv_gateways.core.underlay import mac_bytes
from tianji.southbound import SECTION_TYPES, Endpoint, GatewayConfig, GatewaySection, GatewayVpc

EndpointKey = tuple[int, int]  # (VNI, IP)


@dataclass(frozen=True)
class EndpointWire:
    """Where an address of a VPC lives: its host's VTEP, its MAC."""

    vtep: str
    mac: bytes
    vtep_int: int


@dataclass(frozen=True)
class VpcParts:
    """What one VPC's section contributes: its forwarding (router MAC, endpoints) and the role's policy."""

    vni: int
    router_mac: bytes
    endpoints: tuple[tuple[EndpointKey, EndpointWire], ...]
    policy: Hashable  # the role's own part (compared, never looked into, by the instance)

    def wire(self) -> tuple:
        """What the data plane takes from this VPC."""
        return self.endpoints, self.router_mac


def wire_parts(vpc: GatewayVpc, endpoints: list[Endpoint], policy: Hashable) -> VpcParts:
    eps = tuple(((e.vni, ip2int(e.ip)), EndpointWire(e.vtep_ip, mac_bytes(e.mac), ip2int(e.vtep_ip)))
                for e in endpoints)
    return VpcParts(vpc.vni, mac_bytes(vpc.router_mac), eps, policy)


def sections_of(cfg: GatewayConfig, role: str) -> dict[str, GatewaySection]:
    """A whole config cut into its VPCs' sections of this instance's role (a VNI names one VPC)."""
    static, dnat, eps, lbs, lines, services = (defaultdict(list) for _ in range(6))
    for e in cfg.services:
        services[e.vni].append(e)
    for b in cfg.lbs:
        lbs[b.vni].append(b)
    for x in cfg.lines:
        lines[x.vni].append(x)
    for x in cfg.static:
        static[x.vni].append(x)
    for d in cfg.dnat:
        dnat[d.vni].append(d)
    for e in cfg.endpoints:
        eps[e.vni].append(e)
    cls = SECTION_TYPES[role]
    lists = {"static": static, "dnat": dnat, "lbs": lbs, "lines": lines, "services": services}
    return {v.id: cls.model_construct(vpc=v, endpoints=eps[v.vni], eips=[],
                                      **{k: by[v.vni] for k, by in lists.items() if k in cls.model_fields})
            for v in cfg.vpcs}


@dataclass
class Forwarding:
    """Where the packet path sends what the stage decided: the VPCs' endpoints and router MACs, the VTEPs it
    accepts VXLAN from, the addresses it answers ARP for outside."""

    endpoints: dict[EndpointKey, EndpointWire] = field(default_factory=dict)
    router_mac: dict[int, bytes] = field(default_factory=dict)
    vteps: set[str] = field(default_factory=set)
    served: set[int] = field(default_factory=set)
    ext_net: int = 0  # the external segment (with an edge router: what is on-link; the rest goes to ext_gw)
    ext_mask: int = 0
    ext_gw: int = 0

    def ext_hop(self, dst: int) -> int:
        """The external neighbour a packet to `dst` goes to (native/tj_loop.h's dp_ext_hop)."""
        return self.ext_gw if self.ext_gw and dst & self.ext_mask != self.ext_net else dst

    def replace(self, old: VpcParts | None, new: VpcParts | None) -> None:
        """One VPC's forwarding, from `old` to `new` (None: absent)."""
        if old is not None:
            for k, _ in old.endpoints:
                self.endpoints.pop(k, None)
            self.router_mac.pop(old.vni, None)
        if new is not None:
            self.endpoints.update(new.endpoints)
            self.router_mac[new.vni] = new.router_mac


__all__ = ["EndpointWire", "Forwarding", "VpcParts", "sections_of", "wire_parts"]
