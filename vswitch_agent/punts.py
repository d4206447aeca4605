"""What the agent answers for a VM from a packet-in: DHCP (a controller action in port security), and time
exceeded for a TTL that ran out at the distributed router (OVS's dec_ttl sends the packet here), both from the
VM's subnet gateway. Pure: the answer frame, or None."""

from __future__ import annotations

import logging

from tianji.southbound import HostConfig
from vswitch_agent import dhcp, icmp

log = logging.getLogger("tianji.agent")


def answer(cfg: HostConfig, port_id: str, data: bytes, ttl_expired: bool, icmp_limit: icmp.RateLimit) -> bytes | None:
    port = next(p for p in cfg.ports if p.id == port_id)
    vpc = next(v for v in cfg.vpcs if v.id == port.vpc_id)
    subnet = next(s for s in vpc.subnets if s.id == port.subnet_id)
    if ttl_expired:
        return icmp.time_exceeded(data, vpc.router_mac, subnet.gateway_ip) if icmp_limit.allow() else None
    out = dhcp.reply(data, ip=port.ip, cidr=subnet.cidr, gateway_ip=subnet.gateway_ip, router_mac=vpc.router_mac,
                     mtu=vpc.mtu)
    if out is not None:
        log.info("DHCP: %s gets %s/%s via %s", port_id, port.ip, subnet.cidr.split("/")[1], subnet.gateway_ip)
    return out
