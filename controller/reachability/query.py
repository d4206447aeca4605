"""A reachability question from the API: the source port and the destination resolved (as the caller may see
them), the walk run on configs compiled from one read snapshot, and the answer with another tenant's objects
hidden from a tenant (a peering lets packets through, not the peer's rule names)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.auth import Principal
from controller.errors import ApiError, invalid, not_found
from controller.reachability.explain import Step
from controller.reachability.live import compare
from controller.reachability.walk import EPHEMERAL_PORT, Hop, Leg, Walk
from controller.southbound.compiler import compile_host
from controller.southbound.gateway_compiler import compile_gateway_sections
from controller.state import models as m
from tianji.southbound import GatewayConfig, HostConfig


class DbCluster:
    """Configs compiled from one read session (the walk asks for each host once)."""

    def __init__(self, s: Session) -> None:
        self.s = s

    def host_config(self, host: str) -> HostConfig | None:
        return compile_host(self.s, host)

    def host_at(self, vtep_ip: str) -> tuple[str, str, str | None] | None:
        row = self.s.execute(select(m.Host.name, m.Host.kind, m.Host.role).where(m.Host.vtep_ip == vtep_ip)).first()
        return None if row is None else (row[0], row[1], row[2])

    def gateway_config(self, name: str) -> GatewayConfig | None:
        c = compile_gateway_sections(self.s, name)
        return None if c is None else c.config()

    def vni_tenant(self, vni: int) -> str | None:
        return self.s.execute(select(m.Vpc.tenant_id).where(m.Vpc.vni == vni)).scalar_one_or_none()


@dataclass
class Question:
    source_port_id: str
    ip: str | None
    port_id: str | None
    eip: str | None
    protocol: str
    port: int | None
    ip_version: int = 4  # a destination port's address of this family (an `ip` says its own)


AskSwitch = Callable[[str, dict[str, Any]], dict[str, Any] | None]


def answer(s: Session, q: Question, p: Principal, ask_switch: AskSwitch | None = None) -> dict[str, Any]:
    """`ask_switch`: put the question to the source host's Open vSwitch too (`live`, reachability/live.py)."""
    src = s.get(m.Port, q.source_port_id)
    if src is None or not (p.sees_all or src.tenant_id == p.tenant_id):
        raise not_found("port", q.source_port_id, "source_port_id")
    if src.host is None:
        raise ApiError(409, f"source_port_id: port {src.id} is bound to no host, so it sends nothing; bind it first",
                       "source_port_id")
    dst_ip, dst_port = _destination(s, q, p)
    if ":" in dst_ip and src.ipv6 is None:
        raise ApiError(409, f"source_port_id: port {src.id} has no IPv6 address, so it sends nothing to {dst_ip}; "
                       "give it one (its subnet needs an IPv6 prefix) or ask about an IPv4 destination",
                       "source_port_id")
    if ":" not in dst_ip and src.ip is None:
        raise ApiError(409, f"source_port_id: port {src.id} has no IPv4 address, so it sends nothing to {dst_ip}",
                       "source_port_id")
    walk = Walk(DbCluster(s), {src.ip, dst_ip} | ({src.ipv6} if src.ipv6 else set()))
    info = next(x for x in walk.model(src.host).cfg.ports if x.id == src.id) if walk.model(src.host) else None
    if info is None:
        raise ApiError(409, f"source_port_id: port {src.id} is not in host {src.host}'s config yet", "source_port_id")
    forward = walk.send(src.host, info, dst_ip, q.protocol, EPHEMERAL_PORT, q.port)
    reply = None
    if forward.end == "delivered" and forward.port_id is not None and forward.packet is not None:
        reply = _reply(walk, forward, q)
    legs = {"forward": _leg(forward, p), "reply": None if reply is None else _leg(reply, p)}
    reachable, reason = _verdict(forward, reply, dst_port, src.id, legs)
    if not reachable and forward.end == "dropped" and "no route to" in reason:
        reason += _no_default_route(s, src.vpc_id, dst_ip)
    live = None
    if ask_switch is not None and forward.sent is not None:
        live = compare(forward, ask_switch(src.host, {"port_id": src.id, "packet": forward.sent}), src.host)
    return _named(s, {"live": live,
        "verdict": "reachable" if reachable else "unreachable", "reason": reason,
        "source": {"port_id": src.id, "ip": src.ipv6 if ":" in dst_ip else src.ip, "vpc_id": src.vpc_id,
                   "host": src.host},
        "destination": {"ip": dst_ip, "port_id": dst_port, "eip": q.eip},
        "protocol": q.protocol, "port": q.port,
        **legs,
    }, p)


PEER = "decided by the peer tenant's configuration"
PEER_HOST = "(the peer tenant's host)"
HIDDEN = "(another tenant's object)"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NAMED = (m.Port, m.SecurityGroup, m.Vpc, m.Subnet, m.NatGateway, m.LoadBalancer, m.PrivateLine)


def _named(s: Session, answer: dict[str, Any], p: Principal) -> dict[str, Any]:
    """The words say objects by their names (the ids stay in each step's `object`). Only words the caller may
    see are left by now (_leg hid the rest); an id of another tenant's object that is still there is not named
    but hidden, so that a slip in the words cannot name a peer's object."""
    steps = [x for leg in ("forward", "reply") if answer[leg] for h in answer[leg]["hops"] for x in h["steps"]]
    texts = [x["does"] for x in steps] + [answer[leg]["reason"] for leg in ("forward", "reply") if answer[leg]]
    ids = {i for text in texts + [answer["reason"]] for i in UUID.findall(text)}
    names: dict[str, str] = {}
    for model in NAMED:
        if ids - names.keys():
            rows = s.execute(select(model.id, model.name, model.tenant_id)
                             .where(model.id.in_(sorted(ids - names.keys())))).tuples().all()
            names |= {i: name if p.sees_all or owner == p.tenant_id else HIDDEN for i, name, owner in rows}

    def say(text: str) -> str:
        return UUID.sub(lambda mt: names.get(mt.group(0)) or mt.group(0), text)

    for x in steps:
        x["does"] = say(x["does"])
    for leg in ("forward", "reply"):
        if answer[leg]:
            answer[leg]["reason"] = say(answer[leg]["reason"])
    answer["reason"] = say(answer["reason"])
    return answer


def _verdict(forward: Leg, reply: Leg | None, dst_port: str | None, src_id: str, said: dict[str, Any]) \
        -> tuple[bool, str]:
    """Said from the legs' words as the caller sees them (`said`: the rendered legs)."""
    there = said["forward"]["reason"]
    if forward.end == "dropped":
        return False, there
    if forward.end == "delivered" and dst_port is not None and forward.port_id != dst_port:
        return False, f"{there}, not to port {dst_port}"
    if reply is None:
        return True, there
    if reply.end != "delivered" or reply.port_id != src_id:
        return False, f"the request arrives ({there}) but the reply does not return: {said['reply']['reason']}"
    return True, f"{there}; the reply returns"


def _no_default_route(s: Session, vpc_id: str, dst_ip: str) -> str:
    """For an internet address the VPC has no route to (so no 0.0.0.0/0: the walk found none): the NAT gateway it
    would go to, if the VPC has one (the tenant's own VPC: nothing of another's is said)."""
    if not ipaddress.ip_address(dst_ip).is_global:
        return ""
    gw = s.execute(select(m.NatGateway.id).where(m.NatGateway.vpc_id == vpc_id).order_by(m.NatGateway.created_at)) \
        .scalars().first()
    if gw is None:
        return ""
    return f"; the VPC's NAT gateway {gw} has no route 0.0.0.0/0 to it: add one with the gateway as its target"


def _destination(s: Session, q: Question, p: Principal) -> tuple[str, str | None]:
    given = [k for k in ("ip", "port_id", "eip") if getattr(q, k) is not None]
    if len(given) != 1:
        raise invalid("destination", "give exactly one of ip, port_id, eip")
    if q.port_id is not None:
        port = s.get(m.Port, q.port_id)
        if port is None or not (p.sees_all or port.tenant_id == p.tenant_id):
            raise not_found("port", q.port_id, "destination.port_id")
        if q.ip_version == 6 and port.ipv6 is None:
            raise ApiError(409, f"destination.port_id: port {port.id} has no IPv6 address", "destination.port_id")
        return (port.ipv6 if q.ip_version == 6 else port.ip), port.id
    if q.eip is not None:
        eip = s.execute(select(m.Eip).where(m.Eip.address == q.eip)).scalar_one_or_none()
        if eip is None or not (p.sees_all or eip.tenant_id == p.tenant_id):
            raise not_found("EIP", q.eip, "destination.eip")
        return eip.address, None
    assert q.ip is not None
    return q.ip, None


def _reply(walk: Walk, forward: Leg, q: Question) -> Leg:
    """The destination answers from the port the request reached, to the address and port it came from."""
    assert forward.packet is not None and forward.port_id is not None
    pkt, host = forward.packet, forward.hops[-1].host
    model = walk.model(host)
    assert model is not None
    port = next(x for x in model.cfg.ports if x.id == forward.port_id)
    return walk.send(host, port, pkt.get("ipv4_src", pkt.get("ipv6_src")), q.protocol, q.port or 0, EPHEMERAL_PORT)


def _sees(p: Principal, tenant_id: str | None) -> bool:
    """Whether the caller may read what `tenant_id`'s configuration says (None: nobody's, the cluster's)."""
    return tenant_id is None or p.sees_all or tenant_id == p.tenant_id


def _leg(leg: Leg, p: Principal) -> dict[str, Any]:
    mine = _sees(p, leg.tenant_id)
    return {"end": leg.end, "reason": leg.reason if mine else f"{PEER}: {leg.end}",
            "delivered_to": leg.port_id if mine else None, "hops": [_hop(h, p) for h in leg.hops]}


def _hop(h: Hop, p: Principal) -> dict[str, Any]:
    steps = [_step(x, p) for x in h.steps]
    if not _sees(p, h.tenant_id):  # where the peer's VMs run and its VNI are the peer's
        return {"host": PEER_HOST, "kind": h.kind, "role": h.role, "vni": None, "steps": steps}
    return {"host": h.host, "kind": h.kind, "role": h.role, "vni": h.vni, "steps": steps}


def _step(x: Step, p: Principal) -> dict[str, Any]:
    if not _sees(p, x.tenant_id):
        return {"table": x.table, "does": f"{PEER}: {'dropped' if x.dropped else 'passed'}", "object": None}
    return {"table": x.table, "does": x.does, "object": x.object}
