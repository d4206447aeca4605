"""Private lines in compiled configs: the vSwitches' routes to the lines' prefixes (through the private-line
instances that learned them, or carry the line's sessions for its static routes), and a private-line instance's
sections (the lines whose sessions are placed on it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.roles.role import CompileInputs, RoleCompiler, Sections, section_of
from controller.southbound.placement import line_buckets, line_hosts, line_sessions
from controller.state import models as m
from controller.state.reads import Q_LINES
from tianji.served import LineSessionServed, PrivateLineServed
from tianji.southbound import LineSection, RouteInfo

LINE_ROLE = "private-line"  # the gateway role that carries private lines


def live_line_instances(s: Session) -> dict[str, str]:
    """The live private-line instances: name -> VTEP (what compiles read from the topology fragment)."""
    q = select(m.Host.name, m.Host.vtep_ip).where(m.Host.kind == "gateway", m.Host.role == LINE_ROLE,
                                                  m.Host.status == "up").order_by(m.Host.name)
    return dict(s.execute(q).tuples().all())


def pairs_of(line: Any) -> list[tuple[str, str]]:
    """A line's sessions' (local, customer) addresses, ADDRESS/LEN, primary first (`line`: a PrivateLine row, or a
    row read with its columns)."""
    pl = f"/{line.prefixlen}"
    out = [(line.local_ip + pl, line.customer_ip + pl)]
    if line.secondary_local_ip:
        out.append((line.secondary_local_ip + pl, line.secondary_customer_ip + pl))
    return out


def session_instances(line_id: str, has_secondary: bool, live: dict[str, str] | list[str],
                      placed: Sequence[str | None] = ()) -> set[str]:
    """The instances carrying a session of the line now: what it learned before a session moved away routes
    nothing."""
    return {i for i in line_hosts(line_id, 2 if has_secondary else 1, live, placed) if i}


def placed_in(row: Any) -> tuple[str | None, str | None]:
    """A line's placement as a row of Q_LINES or Q_LINE_ROUTES carries it (controller/roles/line/placement.py)."""
    return row.placed0, row.placed1


def line_route_infos(rows: list, live: dict[str, str], taken: set[str]) -> list[RouteInfo]:
    """An own VPC's routes over its private lines (Q_LINE_ROUTES' rows): each destination through the live
    instances that learned it (origin bgp) or that carry the line's sessions (origin static, a blackhole when
    none is live: the customer said the prefix is over there). A destination the VPC routes already (`taken`: its
    own CIDR, peers, the user's routes) keeps that route; of two lines with one prefix, the first line's wins.
    With several instances, the VM's source address picks one (the NAT gateways' buckets)."""
    through: dict[tuple[str, str], tuple[str, set[str]]] = {}  # (destination, line) -> (origin, instances)
    carrying: dict[str, set[str]] = {}  # line -> session_instances, placed once per line
    for r in rows:
        key = (r.destination, r.line_id)
        if r.line_id not in carrying:
            carrying[r.line_id] = session_instances(r.line_id, r.secondary_local_ip is not None, live, placed_in(r))
        if r.origin == "static":
            through[key] = ("static", set(carrying[r.line_id]))
        elif through.get(key, ("bgp",))[0] == "bgp" and r.instance in carrying[r.line_id]:
            through.setdefault(key, ("bgp", set()))[1].add(r.instance)
    out: list[RouteInfo] = []
    seen = set(taken)
    for (dest, line_id), (origin, insts) in sorted(through.items()):
        if dest in seen or (origin == "bgp" and not insts):
            continue
        seen.add(dest)
        if not insts:
            out.append(RouteInfo(destination=dest, target_type="blackhole", target_id=line_id, origin=origin))
            continue
        buckets = [live[i] for i in line_buckets(f"line:{line_id}:{dest}", sorted(insts))]
        out.append(RouteInfo(destination=dest, target_type="private-line", target_id=line_id, origin=origin,
                             gateway_vteps=sorted({live[i] for i in insts}), gateway_buckets=buckets))
    return out


def line_sections(c: CompileInputs) -> Sections:
    """The sections of these VPCs for private-line instance `c.name`: each line with its sessions placed here (a
    line whose sessions are all elsewhere has nothing to do here), with the VPC's endpoints to deliver to."""
    name, vpcs, live = c.name, c.vpcs, c.live
    lines: dict[str, list] = defaultdict(list)
    statics: dict[str, list[str]] = defaultdict(list)
    for r in c.rows["lines"]:
        if not lines[r.id]:
            lines[r.id].append(r)
        if r.destination is not None:
            statics[r.id].append(r.destination)
    by_vpc: dict[str, list[PrivateLineServed]] = defaultdict(list)
    for line_id, (r,) in lines.items():
        here = [LineSessionServed.model_construct(local_ip=lo, customer_ip=cu, prefixlen=r.prefixlen)
                for inst, lo, cu in line_sessions(line_id, pairs_of(r), live, placed_in(r)) if inst == name]
        if not here:
            continue
        v = vpcs[r.vpc_id]
        by_vpc[r.vpc_id].append(PrivateLineServed.model_construct(
            id=line_id, vni=v.vni, vlan_id=r.vlan_id, local_asn=c.asn, customer_asn=r.customer_asn,
            md5_password=r.md5_password, max_prefixes=r.max_prefixes, vpc_cidr=r.vpc_cidr, mtu=v.mtu,
            sessions=here, static_routes=statics[line_id]))
    return {vid: section_of(LineSection, vid, vpcs[vid], endpoints=list(c.endpoints[vid]), lines=served)
            for vid, served in by_vpc.items()}


ROLE = RoleCompiler(LINE_ROLE, (("lines", Q_LINES),), line_sections)
