"""One host's br-int as the agent programs it, in the OpenFlow model (ofmodel): the flows `compute_flows` builds
for the host's config, with OpenFlow ports and conntrack zones assigned as the agent would. The reachability
analyzer walks a tenant's question through these; what it finds is what the switch would do.

Only a host's OpenFlow port numbers and zone numbers are made up (the switch picks its own, and no flow's
meaning depends on their values).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from tianji.memo import Memo
from tianji.southbound import HostConfig
from vswitch_agent.flows import compute_flows
from vswitch_agent.lb_flows import member_zone_seeds
from vswitch_agent.ofmodel import CONTROLLER, Switch

TUNNEL_OFPORT = 0xFF00  # the VXLAN port; VM ports are numbered from 1


class ModelHost:
    """A host's switch with conntrack that lives as long as this object: a reply walked after its request finds
    the connection the request committed."""

    def __init__(self, cfg: HostConfig) -> None:
        self.cfg = cfg
        self.ofports = {p.id: i for i, p in enumerate(sorted(cfg.ports, key=lambda p: p.id), start=1)}
        self.port_of = {of: pid for pid, of in self.ofports.items()}
        keys = {p.vpc_id for p in cfg.ports} | member_zone_seeds(cfg).keys()
        self.zones = {k: z for z, k in enumerate(sorted(keys), start=1)}
        self.switch = Switch(compute_flows(cfg, self.ofports, TUNNEL_OFPORT, self.zones))

    def from_port(self, port_id: str, pkt: dict) -> list[tuple[object, dict]]:
        """What comes out for a frame a local VM sends."""
        return self.switch.inject(pkt | {"in_port": self.ofports[port_id]})

    def from_tunnel(self, pkt: dict, src_vtep: str) -> list[tuple[object, dict]]:
        """What comes out for a VXLAN packet from another host (the tunnel's VNI in `tunnel_id`)."""
        inner = {k: v for k, v in pkt.items() if not k.startswith("reg") and k not in ("metadata", "in_port",
                                                                                          "ct_state", "ct_mark",
                                                                                          "ct_label")}
        return self.switch.inject(inner | {"in_port": TUNNEL_OFPORT, "tun_ipv4_src": src_vtep})

    def arp(self, port_id: str, mac: str, ip: str, target: str) -> str | None:
        """The MAC the switch answers for `target` to a VM's ARP request, or None (no answer)."""
        req = arp_request(mac, ip, target)
        for port, reply in self.from_port(port_id, req):
            if port == self.ofports[port_id] and reply.get("arp_op") == 2:
                return str(reply["arp_sha"] if isinstance(reply["arp_sha"], str) else _mac(reply["arp_sha"]))
        return None

    def nd(self, port_id: str, mac: str, src: str, target: str) -> str | None:
        """The MAC the switch answers for `target` to a VM's neighbour solicitation, or None (no answer)."""
        for port, reply in self.from_port(port_id, nd_solicitation(mac, src, target)):
            if port == self.ofports[port_id] and reply.get("icmpv6_type") == 136:
                return str(reply["ipv6_nd_tll"])
        return None

    def where(self, port: object) -> str:
        """An output port in words: a VM port's id, "tunnel" or "controller"."""
        if port == TUNNEL_OFPORT:
            return "tunnel"
        if port == CONTROLLER:
            return "controller"
        return self.port_of.get(port, f"ofport {port}")  # type: ignore[call-overload]


def arp_request(mac: str, ip: str, target: str) -> dict:
    return {"eth_src": mac, "eth_dst": "ff:ff:ff:ff:ff:ff", "eth_type": 0x0806, "arp_op": 1, "arp_spa": ip,
            "arp_sha": mac, "arp_tpa": target, "arp_tha": "00:00:00:00:00:00"}


def nd_solicitation(mac: str, src: str, target: str) -> dict:
    """A VM's solicitation for `target` (to its solicited-node multicast group), with its link-layer option."""
    low = ipaddress.IPv6Address(target).packed[-3:]
    return {"eth_src": mac, "eth_dst": "33:33:ff:" + ":".join(f"{b:02x}" for b in low), "eth_type": 0x86DD,
            "ipv6_src": src, "ipv6_dst": str(ipaddress.IPv6Address(b"\xff\x02" + bytes(9) + b"\x01\xff" + low)),
            "ip_proto": 58, "icmpv6_type": 135, "ipv6_nd_target": target, "ipv6_nd_sll": mac, "ttl": 255}


def _mac(n: int) -> str:
    return ":".join(f"{b:02x}" for b in n.to_bytes(6, "big"))


def pruned(cfg: HostConfig, addresses: Iterable[str]) -> HostConfig:
    """`cfg` with only the endpoints a question about `addresses` can meet (those addresses and every load
    balancer's members). A host's other endpoints add flows that match other destination addresses only (ARP
    targets, FORWARD), so they cannot change the walk; leaving them out keeps a question about a 20,000-port VPC
    fast."""
    keep = set(addresses) | {b.ip for v in cfg.vpcs for lb in v.load_balancers for x in lb.listeners
                             for b in x.backends}
    out = cfg.model_copy(update={"endpoints": [e for e in cfg.endpoints if e.ip in keep or e.ipv6 in keep]})
    out._by_vpc = Memo()  # the copy's grouping is its own
    return out
