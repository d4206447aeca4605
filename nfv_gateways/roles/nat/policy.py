"""What a NAT instance is told to do, as typed records: per VPC its SNAT rules, 1:1 EIPs and DNAT rules and its
MTU (`VpcNat`, one per section, built by role.py from the controller's config), and the instance's own settings
(its slice of the port range, timeouts, MTUs). reference.py carries them out; native.py hands each VPC's record
to C on its own."""

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
class StaticEip:
    """A 1:1 EIP: the VPC's address `ip` is `eip` outside, every protocol, both ways."""

    vni: int
    ip: int
    eip: int


@dataclass(frozen=True)
class DnatRule:
    """`eip`:`port` (`proto`) outside goes to the VPC's `ip`:`iport`."""

    eip: int
    proto: int
    port: int
    vni: int
    ip: int
    iport: int


@dataclass(frozen=True)
class VpcNat:
    """One VPC's NAT policy: what one section of the config says, installed and replaced on its own."""

    vni: int
    snat: tuple[SnatRule, ...] = ()  # in config order: the first that covers an address picks its EIP
    static: tuple[StaticEip, ...] = ()
    dnat: tuple[DnatRule, ...] = ()
    mtu: int | None = None  # None: the instance's

    def eips(self) -> list[int]:
        """The EIPs this VPC has served here (with repeats: a DNAT rule on an SNAT EIP counts twice)."""
        return [e for r in self.snat for e in r.eips] + [s.eip for s in self.static] + [d.eip for d in self.dnat]


@dataclass(frozen=True)
class NatSettings:
    port_lo: int = 1024  # the slice of the port range this instance owns
    port_hi: int = 65535
    timeouts: Timeouts = field(default_factory=Timeouts)
    mtu: int = 1450  # inside a VPC whose policy names none (the underlay's 1500 less VXLAN's 50)
    external_mtu: int = 1500  # the internet side: bigger packets out (from VPCs with a larger MTU) are cut or refused


@dataclass(frozen=True)
class NatConfig(NatSettings):
    """A whole config: the settings and every VPC's policy (a table starts from one; tests and benches build
    them with `of`)."""

    vpcs: tuple[VpcNat, ...] = ()

    @classmethod
    def of(cls, snat: tuple[SnatRule, ...] = (), static: tuple[StaticEip, ...] = (), dnat: tuple[DnatRule, ...] = (),
           vpc_mtus: tuple[tuple[int, int], ...] = (), **settings: object) -> NatConfig:
        """Rules of any VPCs, grouped into each VPC's policy (SNAT rules keep their order within a VPC)."""
        mtus = dict(vpc_mtus)
        vnis = list(dict.fromkeys([r.vni for r in snat] + [s.vni for s in static] + [d.vni for d in dnat] +
                                  list(mtus)))
        return cls(vpcs=tuple(VpcNat(v, tuple(r for r in snat if r.vni == v), tuple(s for s in static if s.vni == v),
                                     tuple(d for d in dnat if d.vni == v), mtus.get(v)) for v in vnis),
                   **settings)  # type: ignore[arg-type]

    @property
    def snat(self) -> tuple[SnatRule, ...]:
        return tuple(r for v in self.vpcs for r in v.snat)

    def settings(self) -> NatSettings:
        return NatSettings(self.port_lo, self.port_hi, self.timeouts, self.mtu, self.external_mtu)


def changed_vpcs(held: dict[int, VpcNat], config: NatConfig) -> list[tuple[int, VpcNat | None]]:
    """The VPCs whose policy in a whole `config` differs from what is `held`: (VNI, its new policy or None)."""
    new = {v.vni: v for v in config.vpcs}
    return [(vni, new.get(vni)) for vni in held.keys() | new.keys() if held.get(vni) != new.get(vni)]


__all__ = ["DnatRule", "NatConfig", "changed_vpcs", "NatSettings", "SnatRule", "StaticEip", "Timeouts", "VpcNat"]
