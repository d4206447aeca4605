"""Flows to OpenFlow 1.3 wire messages (the only module that knows os-ken's classes).

The agent sends flow mods as bytes it encodes itself: building os-ken objects costs about 160 us a flow, which
at 100,000 flows is most of a bulk load. Match fields and actions are encoded with os-ken's own field and action
serialisers, once per distinct value (cached), and assembled with struct; `flow_add` (the os-ken object) stays
as the reference: tests/unit/test_openflow.py requires both to give the same bytes for every flow the pipeline
builds. Changes go to the switch in ONF bundles (OpenFlow 1.3's bundle extension), so each is applied atomically.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Any

from os_ken.ofproto import nicira_ext, ofproto_common
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from vswitch_agent import pipeline as P
from vswitch_agent.actions import (
    Action,
    CheckPktLarger,
    Conjunction,
    Controller,
    Ct,
    DecTtl,
    GotoTable,
    Load,
    Move,
    Multipath,
    Nat,
    Output,
    OutputReg,
    SetField,
)
from vswitch_agent.flow import Flow

NX_CT_RECIRC_NONE = 255
NX_NAT_F_DST = 1 << 1  # OVS's nx_nat_flags (os-ken names none)
NX_HASH_FIELDS_SYMMETRIC_L3L4_UDP = 3  # OVS's nx_hash_fields (os-ken names only 0 and 1): IP addresses, TCP/UDP ports
ALL_COOKIE = 0xFFFFFFFFFFFFFFFF
OFP_VERSION = ofp.OFP_VERSION

_HDR = struct.Struct("!BBHI")
_FLOW_MOD = struct.Struct("!BBHIQQBBHHHIIIH2x")
_BUNDLE_CTRL = struct.Struct("!BBHIIIIHH")
_BUNDLE_ADD = struct.Struct("!BBHIIII2xH")
_MULTIPART_FLOW = struct.Struct("!BBHIHH4xB3xII4xQQ")


class _NAT(parser.NXActionNAT):
    """os-ken's NAT action, padded to the 8 bytes its length field claims: its own serializer leaves the padding
    out, which a standalone action survives (OpenFlow pads the list) but one nested in ct() does not."""

    def serialize(self, buf: bytearray, offset: int) -> None:
        super().serialize(buf, offset)
        buf += b"\0" * ((-(len(buf) - offset)) % 8)


ERICOXM_OF = 0x1000  # the OXM class of OVS's ND extension fields (os-ken has none of them)
ERIC_FIELDS = {"nd_reserved": (1, 4), "nd_options_type": (2, 1)}  # name -> (field, bytes), OVS 2.11+


class EricSetField:
    """set_field of one of OVS's ERICOXM_OF fields (`nd_reserved`, `nd_options_type`): what turns a neighbour
    solicitation into its advertisement in the switch (os-ken knows no such field: ofmodel.py reads it back)."""

    def __init__(self, name: str, value: int) -> None:
        field, size = ERIC_FIELDS[name]
        self.key, self.value = name, value
        oxm = struct.pack("!I", (ERICOXM_OF << 16) | (field << 9) | size) + value.to_bytes(size, "big")
        self.data = struct.pack("!HH", ofp.OFPAT_SET_FIELD, 8 * ((4 + len(oxm) + 7) // 8)) + oxm
        self.data += b"\0" * ((-len(self.data)) % 8)
        self.len = len(self.data)

    def serialize(self, buf: bytearray, offset: int) -> None:
        buf[offset:offset + self.len] = self.data


NXAST_CHECK_PKT_LARGER = 49  # OVS 2.12+; os-ken has no class for it
_CHECK_PKT_LARGER = struct.Struct("!HHIHHHI6x")  # type, len, vendor, subtype, pkt_len, offset, dst (NXM header)


def nxm_reg(n: int) -> int:
    """The NXM header of register `n` (NXM_NX_REGn: class 1, field n, 4 bytes)."""
    return (0x0001 << 16) | (n << 9) | 4


class CheckPktLargerAction:
    """check_pkt_larger(length)->field[bit], encoded as OVS reads it back (ofmodel.py decodes it)."""

    def __init__(self, length: int, field: str, bit: int) -> None:
        self.data = _CHECK_PKT_LARGER.pack(ofp.OFPAT_EXPERIMENTER, _CHECK_PKT_LARGER.size,
                                           ofproto_common.NX_EXPERIMENTER_ID, NXAST_CHECK_PKT_LARGER, length, bit,
                                           nxm_reg(int(field.removeprefix("reg"))))
        self.len = len(self.data)

    def serialize(self, buf: bytearray, offset: int) -> None:
        buf[offset:offset + self.len] = self.data


def _value(v: Any) -> Any:
    return tuple(v) if isinstance(v, tuple) else v


def _action(a: Action) -> Any:
    """The os-ken object of one action (GotoTable and metadata are instructions: see instructions())."""
    match a:
        case Output(port=port):
            return parser.OFPActionOutput(port, ofp.OFPCML_NO_BUFFER if port == P.OFPP_CONTROLLER else 0)
        case Controller():
            return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
        case OutputReg(field=field):
            return parser.NXActionOutputReg(ofs_nbits=nicira_ext.ofs_nbits(0, 31), src=field, max_len=0)
        case SetField(field=field, value=value) if field in ERIC_FIELDS:
            return EricSetField(field, value)
        case SetField(field=field, value=value):
            return parser.OFPActionSetField(**{field: value})
        case Load(field=field, ofs=ofs, nbits=nbits, value=value):
            return parser.NXActionRegLoad(ofs_nbits=nicira_ext.ofs_nbits(ofs, ofs + nbits - 1), dst=field,
                                          value=value)
        case Move(src=src, dst=dst, nbits=nbits):
            return parser.NXActionRegMove(src_field=src, dst_field=dst, n_bits=nbits)
        case DecTtl():
            return parser.OFPActionDecNwTtl()
        case CheckPktLarger(length=length, field=field, bit=bit):
            return CheckPktLargerAction(length, field, bit)
        case Ct(commit=commit, zone=zone, table=table, exec_=exec_):
            return parser.NXActionCT(flags=1 if commit else 0, zone_src="", zone_ofs_nbits=zone,
                                     recirc_table=NX_CT_RECIRC_NONE if table is None else table, alg=0,
                                     actions=[_action(x) for x in exec_])
        case Nat(ip=ip, port=port):
            if ip is None:
                return _NAT(flags=0)
            return _NAT(flags=NX_NAT_F_DST, range_ipv4_min=ip, range_ipv4_max=ip, range_proto_min=port,
                        range_proto_max=port)
        case Multipath(n=n, dst=dst):
            return parser.NXActionMultipath(fields=NX_HASH_FIELDS_SYMMETRIC_L3L4_UDP, basis=0,
                                            algorithm=nicira_ext.NX_MP_ALG_HRW, max_link=n - 1, arg=0,
                                            ofs_nbits=nicira_ext.ofs_nbits(0, 15), dst=dst)
        case Conjunction(id=cid, clause=clause, n=n):
            return parser.NXActionConjunction(clause=clause - 1, n_clauses=n, id_=cid)  # 0-based on the wire
    raise ValueError(f"not an action openflow.py encodes: {a!r}")


def _split(actions: tuple[Action, ...]) -> tuple[list[Action], int | None, list[int]]:
    """(apply-actions, metadata to write, tables to go to): OpenFlow 1.3 writes metadata and goes to a table
    with instructions, not actions."""
    apply, metadata, gotos = [], None, []
    for a in actions:
        if isinstance(a, GotoTable):
            gotos.append(a.table)
        elif isinstance(a, SetField) and a.field == "metadata":
            metadata = a.value
        else:
            apply.append(a)
    return apply, metadata, gotos


def instructions(f: Flow) -> list:
    apply, metadata, gotos = _split(f.actions)
    inst: list = []
    if apply:
        inst.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [_action(a) for a in apply]))
    if metadata is not None:
        inst.append(parser.OFPInstructionWriteMetadata(metadata, 0xFFFFFFFFFFFFFFFF))
    inst += [parser.OFPInstructionGotoTable(t) for t in gotos]
    return inst


AFTER_ETH_TYPE = frozenset({"ip_frag"})  # Nicira fields with a prerequisite: OXM order would put them first
_ETH_TYPE = ofp.oxm_from_user_header("eth_type")


def _order(name: str, number: int) -> tuple[int, int]:
    """A match field's place: by OXM number (which puts prerequisites first: eth_type before ipv4_src), but a
    field of AFTER_ETH_TYPE just after eth_type (OVS refuses a prerequisite that comes later: BAD_PREREQ)."""
    return (_ETH_TYPE, 1) if name in AFTER_ETH_TYPE else (number, 0)


def flow_add(dp: Any, f: Flow) -> Any:
    """The os-ken object for adding `f`: the reference `flow_add_bytes` is held to."""
    fields = [ofp.oxm_to_user(*ofp.oxm_from_user(*ofp.oxm_normalize_user(k, _value(v)))) for k, v in f.match]
    fields.sort(key=lambda kv: _order(kv[0], ofp.oxm_from_user_header(kv[0])))
    match = parser.OFPMatch(_ordered_fields=fields)
    return parser.OFPFlowMod(dp, cookie=f.cookie, table_id=f.table, command=ofp.OFPFC_ADD, priority=f.priority,
                             match=match, instructions=instructions(f))


# --- the fast encoder ---------------------------------------------------------------------------------------
# The caches hold the values shared by many flows (VNIs, router MACs, ports); a per-endpoint value is used by a few
# flows only, so 8,192 entries keep the hits and, at 20,000 ports, 33 MB off the agent's peak (65,536 did not).

@lru_cache(maxsize=1 << 13)
def _oxm(name: str, value: Any) -> tuple[Any, bytes]:
    """(sort key, bytes) of one match field: os-ken's serialiser, once per distinct value."""
    k, v = ofp.oxm_normalize_user(name, _value(value))
    n, v, m = ofp.oxm_from_user(k, v)
    buf = bytearray()
    ofp.oxm_serialize(n, v, m, buf, 0)
    return (n[0] if isinstance(n, tuple) else n), bytes(buf)


def _match_bytes(match: tuple) -> bytes:
    fields = sorted((_order(k, number), b) for k, v in match for number, b in (_oxm(k, v),))
    body = b"".join(b for _, b in fields)
    length = 4 + len(body)
    return struct.pack("!HH", ofp.OFPMT_OXM, length) + body + b"\0" * ((-length) % 8)


@lru_cache(maxsize=1 << 13)
def _action_bytes(a: Action) -> bytes:
    buf = bytearray()
    _action(a).serialize(buf, 0)
    return bytes(buf)


def _instructions_bytes(actions: tuple[Action, ...]) -> bytes:
    apply, metadata, gotos = _split(actions)
    parts = []
    if apply:
        body = b"".join(_action_bytes(a) for a in apply)
        parts.append(struct.pack("!HH4x", ofp.OFPIT_APPLY_ACTIONS, 8 + len(body)) + body)
    if metadata is not None:
        parts.append(struct.pack("!HH4xQQ", ofp.OFPIT_WRITE_METADATA, 24, metadata, 0xFFFFFFFFFFFFFFFF))
    for t in gotos:
        parts.append(struct.pack("!HHB3x", ofp.OFPIT_GOTO_TABLE, 8, t))
    return b"".join(parts)


def flow_add_bytes(f: Flow, xid: int) -> bytes:
    """OFPFC_ADD for `f`, as bytes: the same bytes os-ken would send for `flow_add(dp, f)`."""
    body = _match_bytes(f.match) + _instructions_bytes(f.actions)
    length = _FLOW_MOD.size + body.__len__()
    return _FLOW_MOD.pack(OFP_VERSION, ofp.OFPT_FLOW_MOD, length, xid, f.cookie, 0, f.table, ofp.OFPFC_ADD, 0, 0,
                          f.priority, ofp.OFP_NO_BUFFER, 0, 0, 0) + body


_EMPTY_MATCH = struct.pack("!HH4x", ofp.OFPMT_OXM, 4)


def flow_delete_bytes(cookie: int, xid: int) -> bytes:
    """Delete the flow with exactly this cookie, in any table."""
    return _FLOW_MOD.pack(OFP_VERSION, ofp.OFPT_FLOW_MOD, _FLOW_MOD.size + 8, xid, cookie, ALL_COOKIE,
                          ofp.OFPTT_ALL, ofp.OFPFC_DELETE, 0, 0, ofp.OFP_DEFAULT_PRIORITY, ofp.OFP_NO_BUFFER,
                          ofp.OFPP_ANY, ofp.OFPG_ANY, 0) + _EMPTY_MATCH


def bundle_ctrl_bytes(bundle_id: int, type_: int, xid: int) -> bytes:
    return _BUNDLE_CTRL.pack(OFP_VERSION, ofp.OFPT_EXPERIMENTER, _BUNDLE_CTRL.size, xid,
                             ofproto_common.ONF_EXPERIMENTER_ID, ofp.ONF_ET_BUNDLE_CONTROL, bundle_id, type_,
                             ofp.ONF_BF_ATOMIC | ofp.ONF_BF_ORDERED)


def bundle_add_bytes(bundle_id: int, inner: bytes, xid: int) -> bytes:
    """Wrap one message (its own xid inside equals the bundle message's, as OVS requires)."""
    return _BUNDLE_ADD.pack(OFP_VERSION, ofp.OFPT_EXPERIMENTER, _BUNDLE_ADD.size + len(inner), xid,
                            ofproto_common.ONF_EXPERIMENTER_ID, ofp.ONF_ET_BUNDLE_ADD_MESSAGE, bundle_id,
                            ofp.ONF_BF_ATOMIC | ofp.ONF_BF_ORDERED) + inner


def barrier_bytes(xid: int) -> bytes:
    return _HDR.pack(OFP_VERSION, ofp.OFPT_BARRIER_REQUEST, _HDR.size, xid)


def flow_stats_request_bytes(cookie: int, cookie_mask: int, xid: int) -> bytes:
    """Every flow whose cookie matches cookie/cookie_mask, in all tables: one chunk of the audit."""
    return _MULTIPART_FLOW.pack(OFP_VERSION, ofp.OFPT_MULTIPART_REQUEST, _MULTIPART_FLOW.size + 8, xid,
                                ofp.OFPMP_FLOW, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, cookie,
                                cookie_mask) + _EMPTY_MATCH


def packet_out(dp: Any, port: int, data: bytes) -> Any:
    return parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                               actions=[parser.OFPActionOutput(port, 0)], data=data)


def set_config(dp: Any) -> Any:
    return parser.OFPSetConfig(dp, ofp.OFPC_FRAG_NORMAL, 0xFFFF)


def set_async(dp: Any) -> Any:
    """Packet-ins for our controller actions (DHCP) and for a TTL that ran out at dec_ttl (time exceeded)."""
    pin = (1 << ofp.OFPR_NO_MATCH) | (1 << ofp.OFPR_ACTION) | (1 << ofp.OFPR_INVALID_TTL)
    ports = (1 << ofp.OFPPR_ADD) | (1 << ofp.OFPPR_DELETE) | (1 << ofp.OFPPR_MODIFY)
    return parser.OFPSetAsync(dp, [pin, 0], [ports, ports], [0, 0])


class RawFlowStats:
    """One flow of a flow-stats reply, left as bytes: os-ken's parser builds an object tree per flow (about 100 us
    each, seconds for a big switch, during which the agent answers nothing). The audit needs the cookie, the
    counters, and the match+instructions bytes to notice a flow edited by hand."""

    __slots__ = ("length", "table_id", "priority", "cookie", "packet_count", "content")
    _S = struct.Struct("!HBxIIHHHH4xQQQ")

    @classmethod
    def parser(cls, buf: bytes, offset: int) -> RawFlowStats:
        s = cls()
        (s.length, s.table_id, _, _, s.priority, _, _, _, s.cookie, s.packet_count, _) = cls._S.unpack_from(buf, offset)
        s.content = bytes(buf[offset + cls._S.size:offset + s.length])
        return s

    @property
    def is_drop(self) -> bool:
        """A table's default drop: priority 0, empty match, no instructions."""
        return self.priority == 0 and len(self.content) == 8


def use_raw_flow_stats() -> None:
    """Flow-stats replies parse into RawFlowStats in this process (the agent reads no other kind)."""
    parser.OFPFlowStatsReply.cls_stats_body_cls = RawFlowStats
