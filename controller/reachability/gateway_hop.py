"""A gateway instance's part of a walk, read from the config the controller compiled for it (what the instance
serves): the VPC it takes the packet in by VNI, and the translation its role applies (NAT: the 1:1 EIP or the
SNAT rule covering the source; private line: the line of that VNI; services: the endpoint at that address; load
balancer: the VIP's members). Past the instance the packet leaves the overlay (or, for a load balancer, goes to a
member), which the walk does not follow.
"""

from __future__ import annotations

import ipaddress

from controller.reachability.explain import Step, flow_words
from tianji.served import ServiceRuleServed
from tianji.southbound import GatewayConfig

Result = tuple[list[Step], str, str]  # (steps, end, reason)


def gateway_steps(cfg: GatewayConfig, role: str, pkt: dict) -> Result:
    vni, src, dst = pkt["tunnel_id"], pkt["ipv4_src"], pkt["ipv4_dst"]
    entry = Step("gateway", f"{role} instance {cfg.name} takes VNI {vni} in")
    if role == "nat":
        return _nat(cfg, entry, vni, src, dst)
    if role == "private-line":
        line = next((x for x in cfg.lines if x.vni == vni), None)
        if line is None:
            return [entry], "dropped", f"instance {cfg.name} carries no private line for VNI {vni}: dropped"
        s = Step("private_line", f"private line {line.id} (VLAN {line.vlan_id}) to the customer's site for {dst}",
                 {"kind": "private_line", "id": line.id})
        return [entry, s], "left", f"leaves over private line {line.id} (VLAN {line.vlan_id}) for {dst}"
    if role == "service":
        return _service(cfg, entry, vni, dst, pkt)
    if role == "lb":
        lb = next((x for x in cfg.lbs if x.vni == vni and x.vip == dst), None)
        if lb is None:
            return [entry], "dropped", f"instance {cfg.name} serves no load balancer at {dst}: dropped"
        members = sorted({b.ip for x in lb.listeners for b in x.members if b.weight > 0})
        s = Step("load_balancer", f"load balancer {lb.id} picks one of {members}", {"kind": "load_balancer",
                                                                                  "id": lb.id})
        return [entry, s], "balanced", f"load balancer {lb.id} sends it to one of its members {members}"
    return [entry], "dropped", f"instance {cfg.name} has role {role}, which the analyzer does not know: dropped"


def _nat(cfg: GatewayConfig, entry: Step, vni: int, src: str, dst: str) -> Result:
    vpc = next((v for v in cfg.vpcs if v.vni == vni), None)
    if vpc is None:
        return [entry], "dropped", f"NAT instance {cfg.name} serves no VPC of VNI {vni}: dropped"
    static = next((x for x in cfg.static if x.vni == vni and x.ip == src), None)
    if static is not None:
        s = Step("nat", f"1:1 NAT: source {src} becomes its EIP {static.eip}", {"kind": "eip", "address": static.eip})
        return [entry, s], "left", f"leaves NAT instance {cfg.name} for {dst} as EIP {static.eip}"
    addr = ipaddress.IPv4Address(src)
    rules = [r for r in vpc.snat if addr in ipaddress.IPv4Network(r.cidr)]
    if not rules:
        return [entry], "dropped", f"no SNAT rule of VPC {vpc.id} covers source {src}: dropped"
    rule = max(rules, key=lambda r: ipaddress.IPv4Network(r.cidr).prefixlen)
    s = Step("nat", f"SNAT rule {rule.cidr}: source {src} becomes one of {rule.eips}",
             {"kind": "snat_rule", "cidr": rule.cidr, "eips": rule.eips})
    return [entry, s], "left", f"leaves NAT instance {cfg.name} for {dst} from one of {rule.eips}"


def _service(cfg: GatewayConfig, entry: Step, vni: int, dst: str, pkt: dict) -> Result:
    ep = next((x for x in cfg.services if x.vni == vni and x.ip == dst), None)
    if ep is None:
        return [entry], "dropped", f"instance {cfg.name} serves no service endpoint at {dst}: dropped"
    proto = {6: "tcp", 17: "udp"}.get(pkt.get("ip_proto", 0))
    port = pkt.get(f"{proto}_dst")
    if ep.ports and not any(p.protocol == proto and p.port == port for p in ep.ports):
        return [entry], "dropped", f"service endpoint {ep.id} does not take {flow_words(pkt)}: dropped"
    if not any(_allows(r, proto or "icmp", port, pkt["ipv4_src"]) for r in ep.rules):
        return [entry], "dropped", (f"no ingress rule of service endpoint {ep.id}'s security groups allows "
                                    f"{flow_words(pkt)} from {pkt['ipv4_src']}: dropped")
    s = Step("service", f"service endpoint {ep.id}: to {ep.addresses} from {ep.source}",
             {"kind": "service_endpoint", "id": ep.id})
    return [entry, s], "left", f"reaches the service behind endpoint {ep.id} ({', '.join(ep.addresses)})"


def _allows(r: ServiceRuleServed, proto: str, port: int | None, src: str) -> bool:
    if r.protocol not in ("any", proto):
        return False
    if r.port_min is not None and (port is None or not r.port_min <= port <= (r.port_max or r.port_min)):
        return False
    addr = ipaddress.IPv4Address(src)
    return any(addr in ipaddress.IPv4Network(c) for c in r.cidrs)
