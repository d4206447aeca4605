"""The br-int OpenFlow 1.3 pipeline, declared once. Every table number used anywhere comes from here.

Registers and metadata (preserved across conntrack recirculation):
  metadata  the VNI of the VPC the packet currently belongs to (switched to the peer's VNI by peering routes)
  reg0      bit 0 set: the packet arrived from the VXLAN tunnel (never re-tunnelled)
  reg1      bits 0..15: the load-balancer instance a flow to a VIP is hashed to (FORWARD -> LB_STEER)
  reg2      bit 0 set: longer than the route's path MTU (ROUTING -> PATH_MTU: packet too big)
  reg3      the path MTU a route to a smaller MTU checked against (read by the agent from the packet-in)
  reg7      OpenFlow port of the local destination VM, chosen by FORWARD, used by INGRESS_ACL and DELIVER
Conntrack (one zone per VPC on this host, and one more per VPC with load balancers: its VIPs' DNAT, apart from the
security groups' connections, which then see the member's own address and port):
  ct_mark   id of the egress security group rule that admitted the connection here (0: none)
  ct_label  bits 0..31: id of the ingress rule that admitted it here (0: none)
Removing a rule removes the flows that accept its id, so its established connections stop too.
Security group rules are conjunctive matches: clause 1 is one flow per local port (with a conjunction action per
rule of its groups), clause 2 one flow per remote address block of a rule, so flows grow with ports plus members,
not their product; the conj_id flow of a rule commits the connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vswitch_agent.actions import Action, CheckPktLarger, Ct, GotoTable, Load, Move, Multipath, SetField


class PipelineViolation(ValueError):
    """A flow that breaks its table's declaration (matches, sets or goes where the table may not)."""


@dataclass(frozen=True)
class Table:
    """One table: what it is for (`matches`, `does`: the docs) and what its flows may do, enforced on every flow
    built (`verify`, as Faucet's _verify_flowmod): the fields they may match and set, the action kinds, and the
    tables they may go to (always later ones: the pipeline has no loops)."""

    id: int
    name: str
    matches: str
    does: str
    may_match: frozenset[str] = frozenset()
    may_set: frozenset[str] = frozenset()
    may_do: frozenset[str] = frozenset()
    next: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if any(t <= self.id for t in self.next):
            raise PipelineViolation(f"table {self.name} goes back to {sorted(self.next)}: the pipeline has no loops")

    def verify(self, match: Iterable[str], actions: Iterable[Action]) -> None:
        """Raises PipelineViolation naming what a flow does that this table does not declare."""
        if bad := set(match) - self.may_match:
            raise PipelineViolation(f"table {self.name} may not match {sorted(bad)}")
        for a in actions:
            if a.kind not in self.may_do:
                raise PipelineViolation(f"table {self.name} may not {a.kind}: {a}")
            if bad := _targets(a) - self.next:
                raise PipelineViolation(f"table {self.name} may not go to table(s) {sorted(bad)}: {a}")
            if bad := _sets(a) - self.may_set:
                raise PipelineViolation(f"table {self.name} may not set {sorted(bad)}: {a}")

    def verify_once(self, match: tuple[str, ...], actions: tuple[Action, ...]) -> None:
        """`verify`, once per flow shape (100,000s of flows have a few dozen shapes)."""
        shape = (self.id, match, tuple(_shape(a) for a in actions))
        if shape not in _VERIFIED:
            self.verify(match, actions)
            _VERIFIED.add(shape)


_VERIFIED: set[tuple] = set()


def _shape(a: Action) -> tuple:
    """What `verify` looks at in an action: its kind, the field it writes, the table it goes to."""
    if isinstance(a, Ct):
        return (a.kind, a.table, tuple(_shape(x) for x in a.exec_))
    if isinstance(a, Move | Multipath):
        return (a.kind, a.dst)
    if isinstance(a, SetField | Load | CheckPktLarger):
        return (a.kind, a.field)
    if isinstance(a, GotoTable):
        return (a.kind, a.table)
    return (a.kind,)


def _targets(a: Action) -> set[int]:
    if isinstance(a, GotoTable):
        return {a.table}
    if isinstance(a, Ct) and a.table is not None:  # recirculates to a table
        return {a.table}
    return set()


def _sets(a: Action) -> set[str]:
    if isinstance(a, SetField | Load | CheckPktLarger):
        return {a.field}
    if isinstance(a, Move):
        return {a.dst}
    if isinstance(a, Multipath):
        return {a.dst}
    if isinstance(a, Ct):
        return set().union(*(_sets(x) for x in a.exec_))
    return set()


def _d(*names: str) -> frozenset[str]:
    return frozenset(names)


IP4 = _d("eth_type", "ip_proto")
ND = _d("eth_type", "ip_proto", "icmpv6_type", "ipv6_nd_target")
RULE_PORTS = _d("tcp_dst", "udp_dst")  # a rule's port blocks (masked); its remote address is ipv4_src/ipv4_dst


CLASSIFY = Table(0, "classify", "in_port (VM port or VXLAN port + tun_src)",
                 "VM port: metadata=VNI, to PORT_SECURITY. VXLAN from a registered VTEP: to TUNNEL_VNI. Else drop.",
              may_match=_d("in_port", "tun_ipv4_src"),
              may_set=_d("metadata"),
              may_do=_d("goto", "set"), next=frozenset({5, 10}))
TUNNEL_VNI = Table(5, "tunnel_vni", "tun_id; for a VIP with a member here also ipv4_dst",
                   "VNI of a VPC with ports on this host: metadata=VNI, reg0=1, to FORWARD (to LB_DNAT for its "
                   "VIPs). Else drop.",
              may_match=_d("tunnel_id", "eth_type", "ipv4_dst"),
              may_set=_d("metadata", "reg0"),
              may_do=_d("goto", "set", "load"), next=frozenset({45, 50}))
PORT_SECURITY = Table(10, "port_security", "in_port, eth_src, ipv4_src / arp_spa+arp_sha / ipv6_src, ND, DHCP(v6), "
                      "DNS",
                      "DHCP and DHCPv6 server messages, router advertisements, redirects and neighbour "
                      "advertisements (each counted apart): drop, a VM is never a router or a DHCP server. DAD "
                      "(solicitations from ::): drop. The VM's own MAC+IP: IPv4/IPv6 to EGRESS_CT, ARP to "
                      "ARP_RESPONDER, neighbour solicitations with its own MAC (or none) to ND_RESPONDER; DHCP, "
                      "DHCPv6, router solicitations, DNS to its subnet's gateway (the VPC's resolver), and a "
                      "load-balancer member's answers to health probes, to the agent. Else drop.",
              may_match=IP4 | ND | _d("in_port", "eth_src", "ipv4_src", "ipv4_dst", "arp_spa", "arp_sha", "udp_src",
                                      "udp_dst", "tcp_dst", "icmp_type", "ipv6_src", "ipv6_nd_sll"),
              may_set=_d(),
              may_do=_d("goto", "controller"), next=frozenset({20, 21, 30}))
ARP_RESPONDER = Table(20, "arp_responder", "metadata, arp_op=request, arp_tpa",
                      "Known IP (gateway, VPC port, peered port): reply in the switch out of in_port. Else drop.",
              may_match=_d("metadata", "eth_type", "arp_op", "arp_tpa"),
              may_set=_d("eth_dst", "eth_src", "arp_op", "arp_sha", "arp_spa", "arp_tha", "arp_tpa"),
              may_do=_d("load", "move", "output", "set"), next=frozenset())
ND_RESPONDER = Table(21, "nd_responder", "metadata, icmpv6_type=NS, ipv6_nd_target",
                     "Known IPv6 address (the router's link-local and subnets' ::1, a port of the VPC): the "
                     "solicitation becomes the advertisement (R,S,O for the router, S,O for a port), to ND_ANSWER. "
                     "Else drop.",
              may_match=ND | _d("metadata"),
              may_set=_d("eth_dst", "eth_src", "ipv6_src", "ipv6_dst", "icmpv6_type", "nd_reserved",
                         "nd_options_type"),
              may_do=_d("move", "set", "goto"), next=frozenset({22}))
ND_ANSWER = Table(22, "nd_answer", "icmpv6_type=NA (an answer ND_RESPONDER made)",
                  "target link-layer option = eth_src (OVS writes it on an advertisement only), out in_port.",
              may_match=ND,
              may_set=_d("ipv6_nd_tll"),
              may_do=_d("move", "output"), next=frozenset())
EGRESS_CT = Table(30, "egress_ct", "metadata", "ct(zone of the VPC) then EGRESS_ACL",
              may_match=_d("metadata", "eth_type"),
              may_set=_d(),
              may_do=_d("ct"), next=frozenset({31}))
EGRESS_ACL = Table(31, "egress_acl", "ct_state, ct_mark; conjunctions: in_port (clause 1), metadata + remote "
                   "address/protocol/ports (clause 2); conj_id",
                   "inv: drop. est/rel with a live (or no) egress rule mark: EGRESS_ACL_LABEL. new, and a rule's "
                   "conjunction complete (the sending port is in its group, the packet matches its remote side): "
                   "conj_id=rule: commit with ct_mark=rule, to LB_UNNAT. Else drop.",
              may_match=IP4 | RULE_PORTS | _d("ct_state", "ct_mark", "conj_id", "in_port", "metadata", "ipv4_dst",
                                              "ipv6_dst"),
              may_set=_d("ct_mark"),
              may_do=_d("conj", "ct", "goto"), next=frozenset({32, 35}))
EGRESS_ACL_LABEL = Table(32, "egress_acl_label", "ct_label[0..31]",
                         "live (or no) ingress rule id: LB_UNNAT. Else drop (its rule was removed).",
              may_match=_d("ct_label"),
              may_set=_d(),
              may_do=_d("goto"), next=frozenset({35}))
LB_UNNAT = Table(35, "lb_unnat", "metadata, ipv4_src + ip_proto + tcp_src/udp_src of a local load-balancer member",
                 "a member's replies: ct(nat) in the VPC's LB zone (source back to VIP:listener port), ROUTING. "
                 "Else ROUTING.",
              may_match=IP4 | _d("metadata", "ipv4_src", "tcp_src", "udp_src"),
              may_set=_d(),
              may_do=_d("ct", "goto"), next=frozenset({40}))
ROUTING = Table(40, "routing", "metadata, eth_dst=router MAC, ipv4_dst (longest prefix first); for NAT "
                "gateways with several instances also ipv4_src & 7 (the VM's bucket); a port's own EIP: ipv4_src",
                "local: TTL-1 (TTL run out: to the agent, which answers time exceeded from the subnet gateway), "
                "eth_src=router MAC. peering: also metadata=peer VNI. nat-gateway, private-line: TTL-1, "
                "tunnel to the instance serving the bucket (or homing the port's EIP), in the VPC's VNI. "
                "blackhole/none: drop. Frames not sent to the router MAC (same subnet): FORWARD unchanged. "
                "An IPv6 route to a smaller MTU (a peer VPC's): check_pkt_larger into reg2[0], reg3=that MTU, "
                "PATH_MTU.",
              may_match=_d("metadata", "eth_dst", "eth_type", "ipv4_dst", "ipv4_src", "ipv6_dst"),
              may_set=_d("eth_src", "metadata", "tun_ipv4_dst", "tunnel_id", "reg2", "reg3"),
              may_do=_d("dec_ttl", "goto", "output", "set", "load", "check_pkt_larger"), next=frozenset({41, 50}))
PATH_MTU = Table(41, "path_mtu", "reg2",
                 "reg2[0] (longer than the route's MTU): to the agent, which answers ICMPv6 packet too big with "
                 "reg3 as the MTU (IPv6 is never fragmented in flight); a fragment (its sender sized it) is not "
                 "checked. Else FORWARD.",
              may_match=_d("reg2", "eth_type", "ip_frag"),
              may_set=_d(),
              may_do=_d("controller", "goto"), next=frozenset({50}))
LB_DNAT = Table(45, "lb_dnat", "metadata, eth_dst (the member's MAC: the instance's pick), ipv4_dst=VIP, ip_proto, "
                "tcp_dst/udp_dst=listener port",
                "ct(commit, nat(dst=member:port)) in the VPC's LB zone, FORWARD (established: the same "
                "translation). Else drop.",
              may_match=IP4 | _d("metadata", "eth_dst", "ipv4_dst", "tcp_dst", "udp_dst"),
              may_set=_d(),
              may_do=_d("ct"), next=frozenset({50}))
FORWARD = Table(50, "forward", "metadata, ipv4_dst, reg0",
                "local port: eth_dst, reg7=ofport, INGRESS_CT. remote port (not from tunnel): eth_dst, "
                "tun_id=VNI, tun_dst=VTEP, out VXLAN. A VIP (not from tunnel): tun_id=VNI, reg1=multipath hash of "
                "the 5-tuple over the LB instances, LB_STEER. Unknown: drop (counted).",
              may_match=_d("metadata", "eth_type", "ipv4_dst", "ipv6_dst", "reg0"),
              may_set=_d("eth_dst", "reg7", "tun_ipv4_dst", "tunnel_id", "reg1"),
              may_do=_d("goto", "load", "output", "set", "multipath"), next=frozenset({55, 60}))
LB_STEER = Table(55, "lb_steer", "metadata, ipv4_dst=VIP, reg1 (the instance's link number)",
                 "tun_dst=that instance's VTEP, out VXLAN. Else drop.",
              may_match=_d("metadata", "eth_type", "ipv4_dst", "reg1"),
              may_set=_d("tun_ipv4_dst"),
              may_do=_d("set", "output"), next=frozenset())
INGRESS_CT = Table(60, "ingress_ct", "metadata", "ct(zone of the VPC) then INGRESS_ACL",
              may_match=_d("metadata", "eth_type"),
              may_set=_d(),
              may_do=_d("ct"), next=frozenset({61}))
INGRESS_ACL = Table(61, "ingress_acl", "ct_state, ct_mark; conjunctions: reg7 (clause 1), metadata + remote "
                    "address/protocol/ports (clause 2); conj_id",
                    "inv: drop. est/rel with a live (or no) egress mark: INGRESS_ACL_LABEL. new, and a rule's "
                    "conjunction complete (receiving port in its group, remote side matched): conj_id=rule: commit "
                    "with ct_label=rule, DELIVER. Else drop.",
              may_match=IP4 | RULE_PORTS | _d("ct_state", "ct_mark", "conj_id", "reg7", "metadata", "ipv4_src",
                                              "ipv6_src"),
              may_set=_d("ct_label"),
              may_do=_d("conj", "ct", "goto"), next=frozenset({62, 70}))
INGRESS_ACL_LABEL = Table(62, "ingress_acl_label", "ct_label[0..31]", "live (or no) ingress rule: DELIVER.",
              may_match=_d("ct_label"),
              may_set=_d(),
              may_do=_d("goto"), next=frozenset({70}))
DELIVER = Table(70, "deliver", "-", "output to reg7",
              may_match=_d(),
              may_set=_d(),
              may_do=_d("output_reg"), next=frozenset())

TABLES: tuple[Table, ...] = (CLASSIFY, TUNNEL_VNI, PORT_SECURITY, ARP_RESPONDER, ND_RESPONDER, ND_ANSWER, EGRESS_CT,
                             EGRESS_ACL,
                             EGRESS_ACL_LABEL, LB_UNNAT, ROUTING, PATH_MTU, LB_DNAT, FORWARD, LB_STEER, INGRESS_CT,
                             INGRESS_ACL,
                             INGRESS_ACL_LABEL, DELIVER)

REG_FROM_TUNNEL = "reg0"
REG_LB_LINK = "reg1"
REG_PATH = "reg2"
REG_PATH_MTU = "reg3"
PATH_TOO_BIG = 1  # reg2 bit 0
REG_DST_PORT = "reg7"

# ct_state bits (OVS)
CT_NEW, CT_EST, CT_REL, CT_RPL, CT_INV, CT_TRK = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20

# cookie = kind(8) | object hash(24) | flow hash(32): names the object a flow came from and identifies the flow.
COOKIE_KINDS = {"base": 1, "port": 2, "vtep": 3, "vpc": 4, "endpoint": 5, "route": 6, "rule": 7, "arp": 8, "lb": 9}

OFPP_IN_PORT = 0xFFFFFFF8
OFPP_CONTROLLER = 0xFFFFFFFD


def describe() -> str:
    """The pipeline as a table, for docs and `tianji agent pipeline`."""
    lines = ["| table | name | matches | does | goes to |", "|---|---|---|---|---|"]
    lines += [f"| {t.id} | {t.name} | {t.matches} | {t.does} | {', '.join(map(str, sorted(t.next))) or '-'} |"
              for t in TABLES]
    return "\n".join(lines)
