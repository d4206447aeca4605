"""A port's IPv6 address in a dual-stack subnet: its MAC's EUI-64 in a SLAAC subnet (what the VM forms from the
router's advertisement, so the API says it in advance), else the one asked for or the next one handed out
(DHCPv6-stateful), never twice in a VPC."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.api.ipam6 import Ipam6Error, check_fixed_ip6, eui64, next_free6
from controller.api.schemas import PortCreate
from controller.errors import conflict, invalid
from controller.state import models as m

_PORTS = m.Port.__table__


def ipv6_addresses(s: Session, items: list[PortCreate], sn: dict[str, Any], macs: list[str],
                   field: Callable[..., str]) -> list[str | None]:
    """Each item's IPv6 address (None in an IPv4-only subnet); `sn`: the locked subnets' rows, `macs`: the items'
    MACs as they will be created."""
    out: list[str | None] = []
    stateful = sorted({x.subnet_id for x in items if sn[x.subnet_id].ipv6_address_mode == "dhcpv6-stateful"})
    used: dict[str, set[str]] = {sid: set() for sid in stateful}
    if stateful:
        for sid, addr in s.execute(select(_PORTS.c.subnet_id, _PORTS.c.ipv6).where(
                _PORTS.c.subnet_id.in_(stateful), _PORTS.c.ipv6.is_not(None))):
            used[sid].add(addr)
    asked = {x.ipv6: i for i, x in reversed(list(enumerate(items))) if x.ipv6}
    for i, x in enumerate(items):
        r = sn[x.subnet_id]
        if r.ipv6_cidr is None:
            if x.ipv6:
                raise invalid(field(i, "ipv6"), f"subnet {r.name} has no IPv6 CIDR")
            out.append(None)
            continue
        net = ipaddress.IPv6Network(r.ipv6_cidr)
        if r.ipv6_address_mode == "slaac":
            addr = str(eui64(net, macs[i]))
            if x.ipv6 and x.ipv6 != addr:
                raise invalid(field(i, "ipv6"), f"subnet {r.name} is SLAAC: a port's address is its MAC's EUI-64 "
                                                f"({addr}); choose addresses in a dhcpv6-stateful subnet")
        elif x.ipv6:
            if (j := asked[x.ipv6]) != i:
                raise conflict(field(i, "ipv6"), f"{x.ipv6} is requested twice (ports.{j}.ipv6)")
            try:
                addr = str(check_fixed_ip6(net, x.ipv6))
            except Ipam6Error as e:
                raise invalid(field(i, "ipv6"), str(e)) from None
            if addr in used[x.subnet_id]:
                raise conflict(field(i, "ipv6"), f"{addr} is already in use in subnet {r.name}")
        else:
            addr = str(next_free6(net, used[x.subnet_id] | {a for a in asked if a}))
        if x.subnet_id in used:
            used[x.subnet_id].add(addr)
        out.append(addr)
    return out
