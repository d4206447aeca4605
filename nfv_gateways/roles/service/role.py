"""The service role: the VPC gateway to the cluster's services. The vSwitches tunnel a VM's packets to an endpoint's
address here (the endpoint's port lives on the instance homing it); the stage (reference.ServiceTable) translates
them onto the service network, from the endpoint's own source address, and the replies back into the VPC. The
instance answers ARP on the service network for the source addresses of the endpoints it serves (the section's
`eips`).

With a native data plane, the C stage (native/dp_svc.c) holds and carries the connections both ways; every new
connection, and what C is not sure about, is decided here by the reference over the same connections
(native.NativeConns: one owner for each)."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.role import PacketStage, apply_by_vni
from nfv_gateways.core.sections import VpcParts
from nfv_gateways.roles.service.policy import EndpointPolicy, endpoint_of
from nfv_gateways.roles.service.reference import ServiceTable
from tianji.southbound import ServiceSection

if TYPE_CHECKING:
    from nfv_gateways.native.dataplane import NativeDataPlane


class ServiceRole:
    name = "service"
    expiry_interval = 5.0
    fastpath_label = "packet I/O and connections in C once Python admits them"
    backends = ("xdp", "dpdk", "packet")  # only xdp has the flow cache that carries established connections in XDP

    def __init__(self, o: GatewayOptions, counters: Counter[str]) -> None:
        self.o, self.counters = o, counters
        self.table = ServiceTable()
        self._vni: dict[str, int] = {}  # VPC id -> the VNI its endpoints are installed under

    def attach(self, dp: NativeDataPlane | None) -> PacketStage:
        if dp is not None and dp.lib is not None:  # established connections carried by the C stage
            from nfv_gateways.roles.service.native import NativeServiceTable

            self.table = NativeServiceTable(dp)
        return self.table

    def policy_of(self, section: ServiceSection) -> tuple[EndpointPolicy, ...]:
        return tuple(endpoint_of(x) for x in section.services)

    def apply(self, parts: Mapping[str, VpcParts], touched: set[str], first: bool) -> None:
        apply_by_vni(self.table.update_vpc, self._vni, parts, touched)
        self.counters["config_service_applies"] += 1

    def expire(self, now: float) -> None:
        """The connections' timers are the table's (the instance expires the stage)."""

    def status(self) -> dict:
        """The endpoints served here (each with its connections now) and the stage's counters."""
        t = self.table
        # copies first: the status is made outside the instance's lock, while a config or a packet changes these
        endpoints, conns = list(t.endpoints.values()), t.conns.conns()
        held = Counter(c.ep.id for c in conns)
        first = sorted(endpoints, key=lambda e: (e.vni, e.ip))[:STATUS_ENDPOINTS]
        served = [{"id": e.id, "vni": e.vni, "ip": _ip(e.ip), "source": _ip(e.source),
                   "addresses": [_ip(a) for a in e.addresses], "ports": sorted(f"{_PROTO[p]}/{n}" for p, n in e.ports),
                   "proxy_protocol": e.proxy_protocol, "connections": held[e.id]} for e in first]
        return {"endpoints": len(endpoints), "connections": len(conns), "service": dict(t.counters),
                "endpoints_served": served}


_PROTO = {6: "tcp", 17: "udp"}
STATUS_ENDPOINTS = 100  # the status file lists this many endpoints (by VNI), and counts them all


def _ip(n: int) -> str:
    return socket.inet_ntoa(n.to_bytes(4, "big"))


__all__ = ["ServiceRole"]
