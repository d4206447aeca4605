"""Translate flows.Flow into os-ken OpenFlow 1.3 messages (the only module that knows os-ken's classes)."""

from __future__ import annotations

from typing import Any

from os_ken.ofproto import nicira_ext
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from vswitch_agent import pipeline as P
from vswitch_agent.flows import Flow

NX_CT_RECIRC_NONE = 255
ALL_COOKIE = 0xFFFFFFFFFFFFFFFF


def _value(v: Any) -> Any:
    return tuple(v) if isinstance(v, tuple) else v


def _action(a: tuple) -> Any:
    op = a[0]
    if op == "output":
        return parser.OFPActionOutput(a[1], ofp.OFPCML_NO_BUFFER if a[1] == P.OFPP_CONTROLLER else 0)
    if op == "controller":
        return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
    if op == "output_reg":
        return parser.NXActionOutputReg(ofs_nbits=nicira_ext.ofs_nbits(0, 31), src=a[1], max_len=0)
    if op == "set":
        return parser.OFPActionSetField(**{a[1]: a[2]})
    if op == "load":
        _, name, ofs, nbits, value = a
        return parser.NXActionRegLoad(ofs_nbits=nicira_ext.ofs_nbits(ofs, ofs + nbits - 1), dst=name, value=value)
    if op == "move":
        return parser.NXActionRegMove(src_field=a[1], dst_field=a[2], n_bits=a[3])
    if op == "dec_ttl":
        return parser.OFPActionDecNwTtl()
    if op == "ct":
        _, commit, zone, table, exec_ = a
        return parser.NXActionCT(flags=1 if commit else 0, zone_src="", zone_ofs_nbits=zone,
                                 recirc_table=NX_CT_RECIRC_NONE if table is None else table, alg=0,
                                 actions=[_action(x) for x in exec_])
    raise ValueError(f"unknown action {a!r}")


def instructions(f: Flow) -> list:
    actions, inst, metadata = [], [], None
    for a in f.actions:
        if a[0] == "goto":
            continue
        if a[0] == "set" and a[1] == "metadata":
            metadata = a[2]  # OpenFlow 1.3 writes metadata with an instruction, not an action
            continue
        actions.append(_action(a))
    if actions:
        inst.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions))
    if metadata is not None:
        inst.append(parser.OFPInstructionWriteMetadata(metadata, 0xFFFFFFFFFFFFFFFF))
    for a in f.actions:
        if a[0] == "goto":
            inst.append(parser.OFPInstructionGotoTable(a[1]))
    return inst


def flow_add(dp: Any, f: Flow) -> Any:
    match = parser.OFPMatch(**{k: _value(v) for k, v in f.match})
    return parser.OFPFlowMod(dp, cookie=f.cookie, table_id=f.table, command=ofp.OFPFC_ADD, priority=f.priority,
                             match=match, instructions=instructions(f))


def flow_delete_cookie(dp: Any, cookie: int) -> Any:
    return parser.OFPFlowMod(dp, cookie=cookie, cookie_mask=ALL_COOKIE, table_id=ofp.OFPTT_ALL,
                             command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)


def flow_stats_request(dp: Any) -> Any:
    return parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())


def packet_out(dp: Any, port: int, data: bytes) -> Any:
    return parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                               actions=[parser.OFPActionOutput(port, 0)], data=data)


def fingerprint(stat: Any) -> str:
    """What a flow read back from the switch looks like; a change under the same cookie means an edit by hand."""
    return f"{stat.table_id}/{stat.priority}/{stat.match}/{stat.instructions}"
