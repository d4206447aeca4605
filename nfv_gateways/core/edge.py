"""Edge routing: an instance announces the public addresses it serves (its EIPs, its load balancers' VIP EIPs) as
host routes by BGP, with BFD, to the external side's edge router, which spreads ingress over the instances that
announce an address (ECMP) and withdraws an instance's routes when BFD sees it dead (0.9 s). Without an edge router
(a flat external segment), the instance answers ARP for the addresses it homes instead; with one it does both.

The speaker is FRR in a namespace of the instance's own (core.frr): a tap with the instance's address on the
external segment (`--edge-local`) and the data plane's MAC. Off that segment, packets go to the edge router
(`--edge-peer`), the external side's default route."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

from nfv_gateways.core.frr import FrrNamespace, bfdd_conf

log = logging.getLogger("tianji.gateway")


@dataclass(frozen=True)
class EdgeSpec:
    local: str  # ADDRESS/LEN: the instance's address on the external segment (its speaker's)
    peer: str  # the edge router's address on that segment
    local_asn: int
    peer_asn: int

    @property
    def local_ip(self) -> str:
        return self.local.split("/")[0]

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Interface(self.local).network


def parse_edge(local: str, peer: str, local_asn: int, peer_asn: int) -> EdgeSpec | None:
    """The edge flags as a spec (None: no edge router); SystemExit naming the flag that is wrong."""
    if not local and not peer:
        return None
    try:
        iface = ipaddress.IPv4Interface(local)
    except ValueError:
        raise SystemExit(f"--edge-local {local!r}: give the instance's ADDRESS/LEN on the external segment") from None
    try:
        router = ipaddress.IPv4Address(peer)
    except ValueError:
        raise SystemExit(f"--edge-peer {peer!r}: give the edge router's address") from None
    if router not in iface.network or router == iface.ip:
        raise SystemExit(f"--edge-peer {peer}: must be another address of {iface.network} (--edge-local)")
    for flag, asn in (("--edge-asn", local_asn), ("--edge-peer-asn", peer_asn)):
        if not 0 < asn < 2**32 or asn == 23456:
            raise SystemExit(f"{flag} {asn}: an AS number is 1-4294967295, not 23456 (AS_TRANS)")
    return EdgeSpec(local, peer, local_asn, peer_asn)


def bgpd_conf(spec: EdgeSpec, ns: str) -> str:
    p = spec.peer
    return "\n".join([
        f"hostname {ns}", "frr defaults datacenter", "!", f"router bgp {spec.local_asn}",
        f" bgp router-id {spec.local_ip}", " no bgp ebgp-requires-policy", " no bgp network import-check",
        f" neighbor {p} remote-as {spec.peer_asn}", f" neighbor {p} timers connect 1", f" neighbor {p} bfd",
        " address-family ipv4 unicast", f"  neighbor {p} prefix-list tj-edge-out out", " exit-address-family", "!",
        "ip prefix-list tj-edge-out seq 5 permit 0.0.0.0/0 ge 32", "!"]) + "\n"  # host routes only go out


class EdgeSpeaker(FrrNamespace):
    def __init__(self, instance: str, spec: EdgeSpec, mac: str, workdir: Path) -> None:
        ns = "tje-" + hashlib.blake2b(f"{instance}|{spec.local}".encode(), digest_size=5).hexdigest()
        super().__init__(ns, ns.replace("tje-", "te"), spec.local, spec.peer, mac, workdir,
                         {"bfdd": bfdd_conf(spec.peer, spec.local_ip), "bgpd": bgpd_conf(spec, ns)},
                         f"edge routing: {spec.local} -> {spec.peer} (AS {spec.peer_asn})", instance)
        self.spec = spec
        self.announced: set[str] = set()

    def announce(self, addresses: set[str]) -> None:
        """Announce exactly these addresses (host routes): the ones that are new, withdraw the ones that went."""
        add, drop = sorted(addresses - self.announced), sorted(self.announced - addresses)
        if not add and not drop:
            return
        self.vtysh("configure terminal", f"router bgp {self.spec.local_asn}", "address-family ipv4 unicast",
                   *(f"network {a}/32" for a in add), *(f"no network {a}/32" for a in drop), json_out=False)
        self.announced = set(addresses)
        log.info("edge routing: announcing %d addresses (+%d, -%d)", len(addresses), len(add), len(drop))


__all__ = ["EdgeSpeaker", "EdgeSpec", "bgpd_conf", "parse_edge"]
