"""The br-int OpenFlow 1.3 pipeline, declared once. Every table number used anywhere comes from here.

Registers and metadata (preserved across conntrack recirculation):
  metadata  the VNI of the VPC the packet currently belongs to (switched to the peer's VNI by peering routes)
  reg0      bit 0 set: the packet arrived from the VXLAN tunnel (never re-tunnelled)
  reg7      OpenFlow port of the local destination VM, chosen by FORWARD, used by INGRESS_ACL and DELIVER
Conntrack (one zone per VPC on this host):
  ct_mark   id of the egress security group rule that admitted the connection here (0: none)
  ct_label  bits 0..31: id of the ingress rule that admitted it here (0: none)
Removing a rule removes the flows that accept its id, so its established connections stop too.
Security group rules are conjunctive matches: clause 1 is one flow per local port (with a conjunction action per
rule of its groups), clause 2 one flow per remote address block of a rule, so flows grow with ports plus members,
not their product; the conj_id flow of a rule commits the connection.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    id: int
    name: str
    matches: str
    does: str


CLASSIFY = Table(0, "classify", "in_port (VM port or VXLAN port + tun_src)",
                 "VM port: metadata=VNI, to PORT_SECURITY. VXLAN from a registered VTEP: to TUNNEL_VNI. Else drop.")
TUNNEL_VNI = Table(5, "tunnel_vni", "tun_id",
                   "VNI of a VPC with ports on this host: metadata=VNI, reg0=1, to FORWARD. Else drop.")
PORT_SECURITY = Table(10, "port_security", "in_port, eth_src, ipv4_src / arp_spa+arp_sha, DHCP",
                      "DHCP server messages (UDP from port 67): drop, a VM is never a DHCP server. The VM's own "
                      "MAC+IP: IPv4 to EGRESS_CT, ARP to ARP_RESPONDER; DHCP to the agent. Else drop.")
ARP_RESPONDER = Table(20, "arp_responder", "metadata, arp_op=request, arp_tpa",
                      "Known IP (gateway, VPC port, peered port): reply in the switch out of in_port. Else drop.")
EGRESS_CT = Table(30, "egress_ct", "metadata", "ct(zone of the VPC) then EGRESS_ACL")
EGRESS_ACL = Table(31, "egress_acl", "ct_state, ct_mark; conjunctions: in_port (clause 1), metadata + remote "
                   "address/protocol/ports (clause 2); conj_id",
                   "inv: drop. est/rel with a live (or no) egress rule mark: EGRESS_ACL_LABEL. new, and a rule's "
                   "conjunction complete (the sending port is in its group, the packet matches its remote side): "
                   "conj_id=rule: commit with ct_mark=rule, to ROUTING. Else drop.")
EGRESS_ACL_LABEL = Table(32, "egress_acl_label", "ct_label[0..31]",
                         "live (or no) ingress rule id: ROUTING. Else drop (its rule was removed).")
ROUTING = Table(40, "routing", "metadata, eth_dst=router MAC, ipv4_dst (longest prefix first); for NAT "
                "gateways with several instances also ipv4_src & 7 (the VM's bucket); a port's own EIP: ipv4_src",
                "local: TTL-1 (TTL run out: to the agent, which answers time exceeded from the subnet gateway), "
                "eth_src=router MAC. peering: also metadata=peer VNI. nat-gateway: TTL-1, "
                "tunnel to the instance serving the bucket (or homing the port's EIP), in the VPC's VNI. "
                "blackhole/none: drop. Frames not sent to the router MAC (same subnet): FORWARD unchanged.")
FORWARD = Table(50, "forward", "metadata, ipv4_dst, reg0",
                "local port: eth_dst, reg7=ofport, INGRESS_CT. remote port (not from tunnel): eth_dst, "
                "tun_id=VNI, tun_dst=VTEP, out VXLAN. Unknown: drop (counted).")
INGRESS_CT = Table(60, "ingress_ct", "metadata", "ct(zone of the VPC) then INGRESS_ACL")
INGRESS_ACL = Table(61, "ingress_acl", "ct_state, ct_mark; conjunctions: reg7 (clause 1), metadata + remote "
                    "address/protocol/ports (clause 2); conj_id",
                    "inv: drop. est/rel with a live (or no) egress mark: INGRESS_ACL_LABEL. new, and a rule's "
                    "conjunction complete (receiving port in its group, remote side matched): conj_id=rule: commit "
                    "with ct_label=rule, DELIVER. Else drop.")
INGRESS_ACL_LABEL = Table(62, "ingress_acl_label", "ct_label[0..31]", "live (or no) ingress rule: DELIVER.")
DELIVER = Table(70, "deliver", "-", "output to reg7")

TABLES: tuple[Table, ...] = (CLASSIFY, TUNNEL_VNI, PORT_SECURITY, ARP_RESPONDER, EGRESS_CT, EGRESS_ACL,
                             EGRESS_ACL_LABEL, ROUTING, FORWARD, INGRESS_CT, INGRESS_ACL, INGRESS_ACL_LABEL, DELIVER)

REG_FROM_TUNNEL = "reg0"
REG_DST_PORT = "reg7"

# ct_state bits (OVS)
CT_NEW, CT_EST, CT_REL, CT_RPL, CT_INV, CT_TRK = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20

# cookie = kind(8) | object hash(24) | flow hash(32): names the object a flow came from and identifies the flow.
COOKIE_KINDS = {"base": 1, "port": 2, "vtep": 3, "vpc": 4, "endpoint": 5, "route": 6, "rule": 7, "arp": 8}

OFPP_IN_PORT = 0xFFFFFFF8
OFPP_CONTROLLER = 0xFFFFFFFD


def describe() -> str:
    """The pipeline as a table, for docs and `tianji agent pipeline`."""
    lines = ["| table | name | matches | does |", "|---|---|---|---|"]
    lines += [f"| {t.id} | {t.name} | {t.matches} | {t.does} |" for t in TABLES]
    return "\n".join(lines)
