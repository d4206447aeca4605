"""A private line's policy as the instance holds it: typed from the controller's wire form (PrivateLineServed),
for the packet stage (`reference.Line`) and for the sessions' daemons (`bgp.SessionSpec`)."""

from __future__ import annotations

from nfv_gateways.core.packet import ip2int
from nfv_gateways.roles.line.bgp import SessionSpec
from nfv_gateways.roles.line.reference import Line, Session, prefix_of
from tianji.served import PrivateLineServed


def line_of(x: PrivateLineServed) -> Line:
    return Line(id=x.id, vni=x.vni, vlan=x.vlan_id, mtu=x.mtu, vpc=prefix_of(x.vpc_cidr),
                sessions=tuple(Session(ip2int(s.local_ip.split("/")[0]), ip2int(s.customer_ip.split("/")[0]),
                                       s.prefixlen) for s in x.sessions),
                static=tuple(prefix_of(p) for p in x.static_routes))


def specs_of(x: PrivateLineServed) -> list[SessionSpec]:
    return [SessionSpec(line_id=x.id, vlan=x.vlan_id, local=s.local_ip, customer=s.customer_ip.split("/")[0],
                        local_asn=x.local_asn, customer_asn=x.customer_asn, md5=x.md5_password,
                        max_prefixes=x.max_prefixes, advertise=x.vpc_cidr) for s in x.sessions]


__all__ = ["line_of", "specs_of"]
