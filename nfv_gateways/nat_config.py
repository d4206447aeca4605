"""What a NAT gateway instance is told to do: its SNAT rules, 1:1 EIPs and DNAT rules, the port range it owns,
its timeouts and the VPCs' MTU (built by nat_role.py from the controller's config; nat.py carries it out)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Timeouts:
    udp: float = 300.0
    tcp_established: float = 7440.0
    tcp_transitory: float = 240.0
    icmp: float = 60.0


@dataclass(frozen=True)
class SnatRule:
    vni: int
    cidr: str
    eips: tuple[int, ...]
    # the prefix as integers, parsed once: parsing it per new flow and rule was most of a gateway's CPU
    net: int = field(init=False, repr=False, compare=False)
    mask: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = ipaddress.IPv4Network(self.cidr)
        object.__setattr__(self, "net", int(n.network_address))
        object.__setattr__(self, "mask", int(n.netmask))

    def covers(self, vni: int, ip: int) -> bool:
        return vni == self.vni and ip & self.mask == self.net


@dataclass(frozen=True)
class NatConfig:
    snat: tuple[SnatRule, ...] = ()
    static: tuple[tuple[int, int, int], ...] = ()  # (vni, internal ip, eip): 1:1 EIPs
    dnat: tuple[tuple[int, int, int, int, int, int], ...] = ()  # (eip, proto, ext port, vni, ip, port)
    port_lo: int = 1024
    port_hi: int = 65535
    timeouts: Timeouts = field(default_factory=Timeouts)
    mtu: int = 1450  # inside a VPC unless vpc_mtus says (the underlay's 1500 less VXLAN's 50)
    vpc_mtus: tuple[tuple[int, int], ...] = ()  # (vni, mtu): bigger packets in are cut or refused (DF)
    external_mtu: int = 1500  # the internet side: bigger packets out (from VPCs with a larger MTU) likewise
    _mtus: dict[int, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_mtus", dict(self.vpc_mtus))

    def mtu_of(self, vni: int) -> int:
        return self._mtus.get(vni, self.mtu)


__all__ = ["NatConfig", "SnatRule", "Timeouts"]
