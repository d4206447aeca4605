"""What the agent answers for a VM from a packet-in: DHCP and DNS (controller actions in port security), time exceeded
for a TTL that ran out at the distributed router (OVS's dec_ttl sends the packet here) and packet too big for an
IPv6 packet longer than its route's MTU (PATH_MTU), all from the VM's subnet gateway. Pure: the answer frame, or
None (DNS for names outside the VPC: handed to `forward`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tianji.southbound import HostConfig
from vswitch_agent import dhcp, dhcp6, dns, icmp, icmp6
from vswitch_agent import pipeline as P

log = logging.getLogger("tianji.agent")


def too_big_mtu(match: Any) -> int | None:
    """The route's MTU, when PATH_MTU sent the packet for being longer (its registers, in the packet-in's match)."""
    return match.get(P.REG_PATH_MTU) if match.get(P.REG_PATH, 0) & P.PATH_TOO_BIG else None


def kind(data: bytes, ttl_expired: bool, too_big_mtu: int | None) -> str:
    """What a packet-in is, for the agent's counters."""
    if ttl_expired:
        return "ttl_expired"
    if too_big_mtu is not None:
        return "packet_too_big"
    return "ipv6" if data[12:14] == b"\x86\xdd" else "dhcp"


def answer(cfg: HostConfig, port_id: str, data: bytes, ttl_expired: bool, icmp_limit: icmp.RateLimit,
           too_big_mtu: int | None = None) -> bytes | None:
    """`too_big_mtu`: the switch found the packet longer than its route's MTU (PATH_MTU)."""
    port = next(p for p in cfg.ports if p.id == port_id)
    vpc = next(v for v in cfg.vpcs if v.id == port.vpc_id)
    subnet = next(s for s in vpc.subnets if s.id == port.subnet_id)
    if too_big_mtu is not None:
        if subnet.ipv6_gateway_ip is None or not icmp_limit.allow():
            return None
        return icmp6.packet_too_big(data, too_big_mtu, vpc.router_mac, port.mac, subnet.ipv6_gateway_ip)
    if len(data) > 14 and data[12:14] == b"\x86\xdd":
        return _answer6(port.id, port.ipv6, vpc.router_mac, vpc.mtu, subnet, data, ttl_expired, icmp_limit)
    if ttl_expired:
        return icmp.time_exceeded(data, vpc.router_mac, subnet.gateway_ip) if icmp_limit.allow() else None
    out = dhcp.reply(data, ip=port.ip, cidr=subnet.cidr, gateway_ip=subnet.gateway_ip, router_mac=vpc.router_mac,
                     mtu=vpc.mtu)
    if out is not None:
        log.info("DHCP: %s gets %s/%s via %s", port_id, port.ip, subnet.cidr.split("/")[1], subnet.gateway_ip)
    return out


def _answer6(port_id: str, address: str | None, router_mac: str, mtu: int, subnet, data: bytes, ttl_expired: bool,
             icmp_limit: icmp.RateLimit) -> bytes | None:
    """An IPv6 packet-in: a hop limit run out, a router solicitation or a DHCPv6 message (dual-stack subnets)."""
    if subnet.ipv6_cidr is None or address is None:
        return None
    if ttl_expired:
        return icmp6.time_exceeded(data, router_mac, subnet.ipv6_gateway_ip) if icmp_limit.allow() else None
    if (out := icmp6.answer_rs(data, router_mac, subnet.ipv6_cidr, mtu, subnet.ipv6_address_mode)) is not None:
        return out
    if subnet.ipv6_address_mode == "dhcpv6-stateful" and \
            (out := dhcp6.reply(data, address=address, router_mac=router_mac)) is not None:
        log.info("DHCPv6: %s gets %s", port_id, address)
    return out


def dns_answer(cfg: HostConfig, port_id: str, q: dns.Query, forward: Callable[[dns.Query, str], bool] | None) \
        -> bytes | None:
    """The VPC's resolver: its endpoints' names answered here; another name handed to `forward` (the operator's
    resolver: None, it answers later) or, without one or when it cannot take more, REFUSED."""
    port = next(p for p in cfg.ports if p.id == port_id)
    vpc = next(v for v in cfg.vpcs if v.id == port.vpc_id)
    if dns.is_ours(q):
        return dns.frame_to_vm(q, dns.answer_message(q, {r.name: r.address for r in vpc.dns}), vpc.router_mac)
    if forward is not None and forward(q, vpc.router_mac):
        return None
    return dns.frame_to_vm(q, dns.refused(q), vpc.router_mac)
