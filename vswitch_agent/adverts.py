"""The router's unsolicited advertisements (RFC 4861, 6.2.4): every `INTERVAL_S` or so, to each plugged port of a
dual-stack subnet, so a VM keeps its default route and prefix without asking; a VM that boots asks (a router
solicitation, answered at once: punts.py)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from tianji.southbound import HostConfig
from vswitch_agent.icmp6 import mac_bytes, router_advertisement

INTERVAL_S = 200.0  # RFC 4861's MaxRtrAdvInterval is 600 s; a third of the router lifetime (1800 s) keeps it fresh


def adverts(cfg: HostConfig | None, ofports: Mapping[str, int]) -> list[tuple[str, int, bytes]]:
    """(port id, OpenFlow port, RA frame) for each plugged port of a dual-stack subnet, sent to it alone."""
    if cfg is None:
        return []
    vpcs = {v.id: v for v in cfg.vpcs}
    out = []
    for p in cfg.ports:
        vpc = vpcs.get(p.vpc_id)
        sn = next((s for s in vpc.subnets if s.id == p.subnet_id), None) if vpc else None
        if sn is None or not sn.ipv6_cidr or not p.ipv6 or (of := ofports.get(p.id)) is None:
            continue
        mode = sn.ipv6_address_mode or "slaac"
        out.append((p.id, of, router_advertisement(vpc.router_mac, sn.ipv6_cidr, vpc.mtu, mode, mac_bytes(p.mac))))
    return out


def run(sleep: Callable[[float], None], cfg: Callable[[], HostConfig | None], ofports: Callable[[], Mapping[str, int]],
        send: Callable[[int, bytes], None]) -> None:
    """Forever: advertise, then wait the interval, jittered (RFC 4861: routers must not synchronise)."""
    while True:
        for _, of, frame in adverts(cfg(), ofports()):
            send(of, frame)
        sleep(INTERVAL_S * random.uniform(0.75, 1.0))



class Fresh:
    """Ports advertised to since they were plugged: a port's first advertisement goes out as soon as its flows
    are in (a VM that solicited before them got no answer, and retries only a few times)."""

    def __init__(self) -> None:
        self.told: set[tuple[str, int]] = set()

    def take(self, cfg: HostConfig | None, ofports: Mapping[str, int]) -> list[tuple[int, bytes]]:
        self.told &= set(ofports.items())
        out = [(pid, of, frame) for pid, of, frame in adverts(cfg, ofports) if (pid, of) not in self.told]
        self.told |= {(pid, of) for pid, of, _ in out}
        return [(of, frame) for _, of, frame in out]
