"""The private-line role without a network: sections in, the sessions it wants and the lines its table holds; the
handoff's frames dispatched (to a session's namespace, into a VPC, ignored or dropped and counted)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from scapy.all import ARP, IP, UDP, Dot1Q, Ether, raw

from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.packet import ip2int
from nfv_gateways.core.sections import VpcParts
from nfv_gateways.roles.line.role import LineRole
from tests.unit.test_private_line_reference import served

MAC = "02:00:00:00:01:01"


class FakeSession:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def write(self, frame: bytes) -> None:
        self.frames.append(frame)


class FakeInstance:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.delivered: list[tuple[int, int]] = []
        self.packets = self

    def deliver(self, v, buf) -> None:
        self.delivered.append((v.vni, v.ip))


def role() -> LineRole:
    o = GatewayOptions(name="pl1", controller="", token="", underlay_if="ul0", vtep_ip="172.31.0.1/24",
                       external_if="ho0", macs=("02:00:00:00:00:01", MAC), state_dir=Path("/nonexistent"))
    r = LineRole(o, Counter())
    r.inst = FakeInstance()  # type: ignore[assignment]
    return r


def parts(*lines) -> VpcParts:
    return VpcParts(lines[0].vni if lines else 1000, b"\0" * 6, (), tuple(lines))


def test_sections_make_the_lines_and_the_sessions_it_wants() -> None:
    r = role()
    a, b = served(), served(vni=2000, vlan=200)
    r.apply({"va": parts(a), "vb": parts(b)}, {"va", "vb"}, True)
    assert set(r.table.by_vlan) == {100, 200}
    assert {(s.line_id, s.vlan, s.customer, s.local_asn) for s in r.wanted.values()} == \
        {("line-100", 100, "169.254.10.2", 64512), ("line-200", 200, "169.254.10.2", 64512)}
    r.apply({"va": parts(a)}, {"vb"}, False)  # vb's section went
    assert set(r.table.by_vlan) == {100} and {s.line_id for s in r.wanted.values()} == {"line-100"}
    status = r.status()
    assert [x["vlan"] for x in status["lines"]] == [100]


def test_handoff_frames_go_to_their_session_their_vpc_or_nowhere() -> None:
    r = role()
    r.apply({"va": parts(served())}, {"va"}, True)
    sess = FakeSession()
    r.by_local[(100, ip2int("169.254.10.1"))] = sess  # type: ignore[assignment]
    cust = "02:00:00:00:09:09"
    arp = raw(Ether(src=cust, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="169.254.10.2", pdst="169.254.10.1",
                                                             hwsrc=cust))
    r.from_handoff(100, arp)
    bgp = raw(Ether(src=cust, dst=MAC) / IP(src="169.254.10.2", dst="169.254.10.1") / UDP(dport=3784))
    r.from_handoff(100, bgp)
    assert sess.frames == [arp, bgp]
    assert r.handoff.neighbours[(100, ip2int("169.254.10.2"))] == bytes.fromhex(cust.replace(":", ""))
    data = raw(Ether(src=cust, dst=MAC) / IP(src="192.168.20.9", dst="10.0.1.5") / UDP())
    r.from_handoff(100, data)
    assert r.inst.delivered == [(1000, ip2int("10.0.1.5"))]
    r.from_handoff(100, raw(Ether(src=cust, dst="02:00:00:00:01:02") / IP(src="192.168.20.9", dst="10.0.1.5")))
    r.from_handoff(None, data)
    r.from_handoff(300, data)
    r.from_handoff(100, data[:10])
    assert (r.counters["ignored_not_ours"], r.counters["drop_untagged"], r.counters["drop_unknown_vlan"],
            r.counters["drop_malformed"]) == (1, 1, 1, 1)
    assert len(r.inst.delivered) == 1


def test_tagged_frames_on_the_wire_are_read_as_their_vlan() -> None:
    from nfv_gateways.roles.line.handoff import untag

    wire = raw(Ether(src="02:00:00:00:09:09", dst=MAC) / Dot1Q(vlan=100) / IP(src="192.168.20.9", dst="10.0.1.5")
               / UDP())
    r = role()
    r.apply({"va": parts(served())}, {"va"}, True)
    r.from_handoff(*untag(wire, []))
    assert r.inst.delivered == [(1000, ip2int("10.0.1.5"))]


def test_gateway_status_shows_a_lines_sessions_and_what_they_learned() -> None:
    from rich.console import Console

    from nfv_gateways.cli import line_table

    line = {"id": "line-100", "vlan": 100, "vni": 1000, "routes": 3, "static_routes": ["192.168.20.0/24"],
            "sessions": [{"local_ip": "169.254.10.1/30", "customer_ip": "169.254.10.2/30", "bgp_state": "Established",
                          "bfd_state": "up", "received": 2, "accepted": 2, "advertised": 1,
                          "learned": ["192.168.10.0/24", "192.168.11.0/24"], "last_error": None}]}
    c = Console(width=200, record=True)
    c.print(line_table(line))
    out = c.export_text()
    for want in ("VLAN 100 <-> VNI 1000", "Established", "192.168.11.0/24", "169.254.10.1/30 -> 169.254.10.2/30"):
        assert want in out, out
