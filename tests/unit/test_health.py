"""The agent's health probes (vswitch_agent/health.py), against a member answered by scapy: rise and fall count,
TCP handshakes, HTTP status codes, UDP port unreachable, silence, and garbage never raising."""

from __future__ import annotations

from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import Ether

from tianji.southbound import LbMonitorInfo
from vswitch_agent.health import Prober, Target, code_ok

MAC, RMAC = "02:00:00:00:00:0a", "0a:58:00:00:00:01"


def target(kind: str = "tcp", **kw) -> Target:
    mon = LbMonitorInfo(type=kind, interval_s=1, timeout_s=0.5, rise=2, fall=2, **kw)
    return Target("m1", "10.0.1.10", MAC, 8080, 7, "10.0.1.1", RMAC, mon)


class Member:
    """What the member's port received, and its answers back as the punt flow hands them to the agent."""

    def __init__(self, kind: str = "tcp", **kw) -> None:
        self.sent: list[bytes] = []
        self.reports: list[dict] = []
        self.p = Prober(lambda of, frame: self.sent.append(frame), self.reports.append)
        self.p.update({"m1": target(kind, **kw)})

    def last(self):
        return Ether(self.sent[-1])

    def answer(self, pkt) -> bool:
        return self.p.on_packet(7, bytes(Ether(src=MAC, dst=RMAC) / pkt), self.now)

    def syn_ack(self, flags: str = "SA", data: bytes = b"") -> None:
        q = self.last()
        self.answer(IP(src="10.0.1.10", dst="10.0.1.1") / TCP(sport=8080, dport=q[TCP].sport, seq=1000,
                                                              ack=q[TCP].seq + (1 if "S" in str(q[TCP].flags) else
                                                                                len(q[TCP].payload)), flags=flags)
                    / data)

    def probe(self, at: float) -> None:
        self.now = at
        self.p.tick(at)


def test_tcp_rise_and_fall() -> None:
    m = Member()
    for t in (0.0, 1.0):
        m.probe(t)
        assert m.last()[TCP].flags == "S" and m.last()[IP].src == "10.0.1.1" and m.last()[TCP].dport == 8080
        m.syn_ack()
        assert m.last()[TCP].flags == "R"  # the half-open connection is reset
    assert m.reports == [{"m1": "ONLINE"}]
    m.probe(2.0)
    m.syn_ack("R")  # refused
    m.probe(3.0)
    m.probe(3.6)  # no answer within the timeout
    assert m.reports == [{"m1": "ONLINE"}, {"m1": "OFFLINE"}]


def test_http_status_codes() -> None:
    m = Member("http", url_path="/healthz", expected_codes="200-299")
    m.probe(0.0)
    m.syn_ack()
    req = m.last()
    assert bytes(req[TCP].payload).startswith(b"GET /healthz HTTP/1.0\r\n")
    m.syn_ack("PA", b"HTTP/1.0 204 No Content\r\n\r\n")
    m.probe(1.0)
    m.syn_ack()
    m.syn_ack("PA", b"HTTP/1.0 503 Busy\r\n\r\n")
    assert m.p.states["m1"].bad == 1 and m.reports == []
    assert code_ok(200, None) and code_ok(202, "200,202") and not code_ok(301, "200-299")


def test_udp_connect_unreachable_is_down_silence_is_up() -> None:
    m = Member("udp-connect")
    m.probe(0.0)
    q = m.last()
    assert UDP in q and q[UDP].dport == 8080
    m.answer(IP(src="10.0.1.10", dst="10.0.1.1") / ICMP(type=3, code=3) / bytes(q[IP])[:28])
    m.probe(1.0)
    m.answer(IP(src="10.0.1.10", dst="10.0.1.1") / ICMP(type=3, code=3) / bytes(m.last()[IP])[:28])
    assert m.reports == [{"m1": "OFFLINE"}]
    for t in (2.0, 2.6, 3.0, 3.6):
        m.probe(t)
    assert m.reports[-1] == {"m1": "ONLINE"}


def test_garbage_and_strangers_are_ignored() -> None:
    m = Member()
    m.probe(0.0)
    assert not m.p.on_packet(7, b"\x00" * 10, 0.1)
    assert not m.p.on_packet(9, bytes(Ether() / IP(src="10.0.1.99") / TCP()), 0.1)  # not a member we probe
    # the member's own garbage is not a probe answer either: the other handlers ignore it
    assert not m.p.on_packet(7, bytes(Ether(src=MAC) / IP(src="10.0.1.10", dst="10.0.1.1") / b"\x01"), 0.1)
    assert m.reports == []


def test_a_members_dhcp_and_dns_are_not_taken_for_probe_answers() -> None:
    """A monitored member's VM still gets DHCP and the VPC's resolver: only answers to probes (TCP to a probe
    port, ICMP unreachable about a probe's datagram) are the prober's."""
    m = Member()
    m.probe(0.0)
    for pkt in (IP(src="10.0.1.10", dst="10.0.1.1") / UDP(sport=40000, dport=53) / b"query",
                IP(src="0.0.0.0", dst="255.255.255.255") / UDP(sport=68, dport=67) / b"dhcp",
                IP(src="10.0.1.10", dst="10.0.1.1") / TCP(sport=80, dport=40000, flags="SA")):
        assert not m.p.on_packet(7, bytes(Ether(src=MAC, dst=RMAC) / pkt), 0.1), pkt.summary()
