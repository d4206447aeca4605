"""The agent's own flow-mod encoder gives, byte for byte, what os-ken builds for every flow the pipeline makes."""

from __future__ import annotations

from os_ken.ofproto import ofproto_protocol
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from tests.unit.test_flows import OF, TUN, WEB_FROM_PEER, ZONES, config
from vswitch_agent import openflow
from vswitch_agent.flows import compute_flows


def _dp() -> ofproto_protocol.ProtocolDesc:
    return ofproto_protocol.ProtocolDesc(ofp.OFP_VERSION)


def test_flow_mods_equal_os_kens() -> None:
    flows = compute_flows(config([WEB_FROM_PEER]), OF, TUN, ZONES)
    assert any(f.conjunctive for f in flows) and any("conj_id" in f.m() for f in flows)
    dp = _dp()
    for i, f in enumerate(sorted(flows, key=lambda f: f.cookie)):
        msg = openflow.flow_add(dp, f)
        msg.set_xid(i + 1)
        msg.serialize()
        assert openflow.flow_add_bytes(f, i + 1) == bytes(msg.buf), f


def test_delete_bundle_and_stats_messages_equal_os_kens() -> None:
    dp = _dp()
    msg = parser.OFPFlowMod(dp, cookie=0x0102, cookie_mask=openflow.ALL_COOKIE, table_id=ofp.OFPTT_ALL,
                            command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
    msg.set_xid(7)
    msg.serialize()
    assert openflow.flow_delete_bytes(0x0102, 7) == bytes(msg.buf)
    ctrl = parser.ONFBundleCtrlMsg(dp, 3, ofp.ONF_BCT_COMMIT_REQUEST, ofp.ONF_BF_ATOMIC | ofp.ONF_BF_ORDERED, [])
    ctrl.set_xid(8)
    ctrl.serialize()
    assert openflow.bundle_ctrl_bytes(3, ofp.ONF_BCT_COMMIT_REQUEST, 8) == bytes(ctrl.buf)
    stats = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0x05 << 56, 0xFF << 56,
                                       parser.OFPMatch())
    stats.set_xid(9)
    stats.serialize()
    assert openflow.flow_stats_request_bytes(0x05 << 56, 0xFF << 56, 9) == bytes(stats.buf)
    inner = openflow.flow_delete_bytes(0x0102, 10)
    add = parser.ONFBundleAddMsg(dp, 3, ofp.ONF_BF_ATOMIC | ofp.ONF_BF_ORDERED, parser.OFPFlowMod(
        dp, cookie=0x0102, cookie_mask=openflow.ALL_COOKIE, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
        out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY), [])
    add.set_xid(10)
    add.serialize()
    assert openflow.bundle_add_bytes(3, inner, 10) == bytes(add.buf)
