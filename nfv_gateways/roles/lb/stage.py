"""The load balancer's packet stage: which member a packet to a VIP goes to (the Python side of the instance; the
connection table and Maglev lookups are LbTable's or, in C, NativeLb's).

From a vSwitch (VXLAN, the VPC's VNI): a packet to VIP:listener port is forwarded unchanged to the picked member's
host (`Verdict("in", vni, member)`: the instance encapsulates it to the member's MAC, and that host's vSwitch
translates). A reply from VIP:listener port to the internet (the VIP's EIP is homed here) leaves with the EIP as
source. From the internet: a packet to EIP:listener port gets the VIP as destination and goes to its member.
Anything else (no listener, fragments, not TCP/UDP, malformed) is dropped and counted; nothing raises.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nfv_gateways.core.packet import PROTO_TCP, PROTO_UDP, Verdict, l4_ports, parse_ip4, rewrite_addr

ListenerKey = tuple[int, int, int, int]  # vni, VIP, protocol, port


@dataclass(frozen=True)
class PoolSpec:
    """A listener's pool as the connection table takes it: the Maglev table (indices into `ids`), every member
    number (draining ones too), the idle timeout, and whether it hashes on the client's address alone."""

    table: Any  # list[int] or a ctypes array
    ids: tuple[int, ...]
    idle: float
    source_ip: bool = False


@dataclass
class VpcLb:
    """One VPC's part of what the stage decides with, built by the role from the VPC's section."""

    listeners: dict[ListenerKey, int] = field(default_factory=dict)  # -> pool number
    eip_listeners: dict[tuple[int, int, int], tuple[int, int, int]] = field(default_factory=dict)  # (EIP, proto,
    # port) -> (vni, VIP, pool)
    vip_eips: dict[tuple[int, int], int] = field(default_factory=dict)  # (vni, VIP) -> EIP homed here
    members: dict[int, tuple[int, int]] = field(default_factory=dict)  # member number -> (vni, its address)


@dataclass
class LbPolicy(VpcLb):
    """Every VPC's parts together, kept per VPC: `replace` swaps one VPC's entries."""

    vpcs: dict[str, VpcLb] = field(default_factory=dict)

    def replace(self, vpc_id: str, new: VpcLb | None) -> None:
        old = self.vpcs.pop(vpc_id, None)
        for name in ("listeners", "eip_listeners", "vip_eips", "members"):
            mine: dict = getattr(self, name)
            for k in getattr(old, name) if old else ():
                mine.pop(k, None)
            if new is not None:
                mine.update(getattr(new, name))
        if new is not None:
            self.vpcs[vpc_id] = new


class LbStage:
    def __init__(self, conns: Any) -> None:
        self.conns = conns  # LbTable or NativeLb
        self.policy = LbPolicy()
        self.counters: Counter[str] = Counter()
        self.source_ip: set[int] = set()  # pools with session affinity on the client's address

    def set_pool(self, pool: int, spec: PoolSpec) -> None:
        self.conns.set_pool(pool, spec.table, list(spec.ids), spec.idle)
        if spec.source_ip:
            self.source_ip.add(pool)
        else:
            self.source_ip.discard(pool)

    def _pick(self, pool: int, vni: int, src: int, dst: int, sport: int, dport: int, proto: int,
              now: float) -> int | None:
        if pool in self.source_ip:  # affinity: every connection of a client to one member
            dst, sport, dport, proto = 0, 0, 0, 0
        member = self.conns.pick(pool, vni, src, dst, sport, dport, proto, now)
        got = self.policy.members.get(member) if member >= 0 else None
        if got is None:
            self.counters["drop_no_member"] += 1
            return None
        return got[1]

    def _parse(self, buf: bytearray) -> tuple[Any, tuple[int, int]] | None:
        ip = parse_ip4(buf)
        if ip is None:
            self.counters["drop_malformed"] += 1
            return None
        if ip.proto not in (PROTO_TCP, PROTO_UDP) or ip.is_fragment:
            self.counters["drop_not_tcp_udp" if ip.proto not in (PROTO_TCP, PROTO_UDP) else "drop_fragment"] += 1
            return None
        ports = l4_ports(buf, ip)
        if ports is None:
            self.counters["drop_malformed"] += 1
            return None
        return ip, ports

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        got = self._parse(buf)
        if got is None:
            return None
        ip, (sport, dport) = got
        pool = self.policy.listeners.get((vni, ip.dst, ip.proto, dport))
        if pool is not None:
            member = self._pick(pool, vni, ip.src, ip.dst, sport, dport, ip.proto, now)
            if member is None:
                return None
            self.counters["to_member"] += 1
            return Verdict("in", vni, member)
        eip = self.policy.vip_eips.get((vni, ip.src))
        if eip is not None and (vni, ip.src, ip.proto, sport) in self.policy.listeners:
            rewrite_addr(buf, ip, src=eip)  # a member's reply to an internet client, through the VIP's EIP
            self.counters["to_internet"] += 1
            return Verdict("out")
        self.counters["drop_no_listener"] += 1
        return None

    def inbound(self, buf: bytearray, now: float) -> Verdict | None:
        got = self._parse(buf)
        if got is None:
            return None
        ip, (sport, dport) = got
        target = self.policy.eip_listeners.get((ip.dst, ip.proto, dport))
        if target is None:
            self.counters["drop_no_listener"] += 1
            return None
        vni, vip, pool = target
        member = self._pick(pool, vni, ip.src, vip, sport, dport, ip.proto, now)
        if member is None:
            return None
        rewrite_addr(buf, ip, dst=vip)
        self.counters["from_internet"] += 1
        return Verdict("in", vni, member)

    def expire(self, now: float) -> int:
        return self.conns.expire(now)

