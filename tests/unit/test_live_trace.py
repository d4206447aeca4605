"""What ofproto/trace says, read as the analyzer's live check reads it (traces captured from the emulated
cluster's Open vSwitch 3.1: a local delivery through two conntrack passes, a VXLAN tunnel, a routing drop, a
spoofed source dropped at port security)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.reachability.live import compare, switch_outcome
from controller.reachability.walk import Leg

TRACES = Path(__file__).resolve().parents[1] / "data" / "ofproto_trace"
OFPORTS = {"port-a": 2, "port-c": 3}


@pytest.mark.parametrize("name,want", [("local", ("port", "port-c")), ("tunnel", ("tunnel", "172.31.0.12")),
                                       ("dropped", ("dropped",)), ("spoofed", ("dropped",))])
def test_switch_outcome(name: str, want: tuple) -> None:
    assert switch_outcome((TRACES / f"{name}.txt").read_text(), OFPORTS) == want


def test_agreement_and_disagreement_are_said() -> None:
    trace = (TRACES / "tunnel.txt").read_text()
    ok = compare(Leg([], "left", "", first=("tunnel", "172.31.0.12")), {"output": trace, "ofports": OFPORTS}, "hv1")
    assert ok["agrees"] is True and ok["switch"] == "tunnelled to VTEP 172.31.0.12"
    bad = compare(Leg([], "dropped", "", first=("dropped",)), {"output": trace, "ofports": OFPORTS}, "hv1")
    assert bad["agrees"] is False and bad["note"].startswith("the switch disagrees")
    silent = compare(Leg([], "dropped", "", first=("dropped",)), None, "hv1")
    assert silent["agrees"] is None and "did not answer" in silent["note"]


def test_the_agent_asks_ofproto_trace_about_the_models_packet() -> None:
    from vswitch_agent.live_trace import answer, flow_spec

    pkt = {"eth_src": "02:00:00:00:00:01", "eth_dst": "0a:58:00:00:03:e8", "ipv4_src": "10.0.1.2",
           "ipv4_dst": "10.0.2.3", "ip_proto": 6, "tcp_src": 40000, "tcp_dst": 443, "ttl": 64}
    assert flow_spec(7, pkt) == ("in_port=7,tcp,dl_src=02:00:00:00:00:01,dl_dst=0a:58:00:00:03:e8,"
                                 "nw_src=10.0.1.2,nw_dst=10.0.2.3,nw_ttl=64,tp_src=40000,tp_dst=443")
    icmp = flow_spec(7, pkt | {"ip_proto": 1, "icmp_type": 8})
    assert icmp.endswith("nw_ttl=64,icmp_type=8,icmp_code=0") and ",icmp," in icmp
    from vswitch_agent.model_host import arp_request

    assert flow_spec(7, arp_request("02:00:00:00:00:01", "10.0.1.2", "10.0.1.9")) == (
        "in_port=7,arp,dl_src=02:00:00:00:00:01,dl_dst=ff:ff:ff:ff:ff:ff,arp_op=1,arp_spa=10.0.1.2,"
        "arp_tpa=10.0.1.9,arp_sha=02:00:00:00:00:01,arp_tha=00:00:00:00:00:00")
    assert answer("not json", {}, None) == (None, {})
    assert answer('{"id": "t1", "port_id": "p9", "packet": {}}', {"p1": 3}, None) == (
        "t1", {"error": "port p9 is not plugged on this switch"})
    ident, bad = answer('{"id": "t2", "port_id": "p1", "packet": {"eth_src": 1}}', {"p1": 3}, None)
    assert ident == "t2" and bad["error"].startswith("KeyError")
