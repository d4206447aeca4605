"""The service role's stage (nfv_gateways/roles/service/reference.py) on frames: translation both ways, tenants with
identical addresses apart, admission (ports, security groups), PROXY v2 in the VM's stream, sizes, garbage."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.packet import Raw

from nfv_gateways.core.packet import ip2int
from nfv_gateways.roles.service import proxy_protocol as pp
from nfv_gateways.roles.service.policy import endpoint_of
from nfv_gateways.roles.service.reference import ServiceTable
from tianji.served import ServiceEndpointServed

SVC, EP_IP = "100.100.0.10", "10.0.1.9"
ANY = [{"protocol": "any", "cidrs": ["0.0.0.0/0"]}]


def served(eid: str, vni: int, source: str, proxy: bool = False, rules=None, peers=()) -> ServiceEndpointServed:
    return ServiceEndpointServed(id=eid, vni=vni, ip=EP_IP, mac="02:00:00:00:00:09", source=source,
                                 addresses=[SVC], ports=[{"protocol": "tcp", "port": 80}, {"protocol": "udp",
                                                                                          "port": 53}],
                                 proxy_protocol=proxy, rules=ANY if rules is None else rules, peers=list(peers))


def table(*eps: ServiceEndpointServed) -> ServiceTable:
    t = ServiceTable()
    for vni in {e.vni for e in eps}:
        t.update_vpc(vni, tuple(endpoint_of(e) for e in eps if e.vni == vni))
    return t


def out(t: ServiceTable, vni: int, pkt) -> tuple[object, IP | None]:
    buf = bytearray(bytes(pkt))
    v = t.outbound(vni, buf, 0.0)
    return v, IP(bytes(buf)) if v is not None else None


def back(t: ServiceTable, pkt) -> tuple[object, IP | None]:
    buf = bytearray(bytes(pkt))
    v = t.inbound(buf, 0.0)
    return v, IP(bytes(buf)) if v is not None else None


def test_a_connection_leaves_from_the_endpoints_source_and_its_replies_come_back() -> None:
    t = table(served("e1", 100, "100.100.1.1"))
    v, p = out(t, 100, IP(src="10.0.1.5", dst=EP_IP, ttl=64) / TCP(sport=40000, dport=80, flags="S"))
    assert v.direction == "out" and (p.src, p.dst, p[TCP].sport, p[TCP].dport, p.ttl) == (
        "100.100.1.1", SVC, 40000, 80, 63)
    v, r = back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=40000, flags="SA"))
    assert (v.direction, v.vni, v.ip) == ("in", 100, ip2int("10.0.1.5"))
    assert (r.src, r.dst, r[TCP].sport, r[TCP].dport) == (EP_IP, "10.0.1.5", 80, 40000)
    # checksums are right: scapy recomputes them when they are deleted
    again = IP(bytes(r))
    del again.chksum, again[TCP].chksum
    assert IP(bytes(again)).chksum == r.chksum and IP(bytes(again))[TCP].chksum == r[TCP].chksum


def test_identical_tenants_are_two_sources_and_replies_find_their_own() -> None:
    t = table(served("e1", 100, "100.100.1.1"), served("e2", 200, "100.100.1.2"))
    syn = IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=40000, dport=80, flags="S")
    _, a = out(t, 100, syn)
    _, b = out(t, 200, syn)
    assert (a.src, b.src) == ("100.100.1.1", "100.100.1.2")
    v, _ = back(t, IP(src=SVC, dst="100.100.1.2") / TCP(sport=80, dport=40000, flags="SA"))
    assert v.vni == 200
    assert back(t, IP(src=SVC, dst="100.100.1.3") / TCP(sport=80, dport=40000, flags="SA"))[0] is None


def test_two_vms_on_one_port_get_two_source_ports() -> None:
    t = table(served("e1", 100, "100.100.1.1"))
    _, a = out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / UDP(sport=5353, dport=53))
    _, b = out(t, 100, IP(src="10.0.1.6", dst=EP_IP) / UDP(sport=5353, dport=53))
    assert a[UDP].sport == 5353 and b[UDP].sport != 5353
    v, r = back(t, IP(src=SVC, dst="100.100.1.1") / UDP(sport=53, dport=b[UDP].sport))
    assert (v.ip, r[UDP].dport) == (ip2int("10.0.1.6"), 5353)


def test_admission_by_service_port_and_the_endpoints_security_groups() -> None:
    rules = [{"protocol": "tcp", "port_min": 80, "port_max": 80, "cidrs": ["10.0.1.0/28"]}]
    t = table(served("e1", 100, "100.100.1.1", rules=rules))
    assert out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=1234, dport=22, flags="S"))[0] is None
    assert out(t, 100, IP(src="10.0.1.50", dst=EP_IP) / TCP(sport=1234, dport=80, flags="S"))[0] is None
    assert out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / UDP(sport=1234, dport=53))[0] is None  # no UDP rule
    assert out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=1234, dport=80, flags="S"))[0] is not None
    assert t.counters["drop_port"] == 1 and t.counters["drop_security_group"] == 2
    assert out(t, 300, IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=1234, dport=80, flags="S"))[0] is None
    t.update_vpc(100, None)  # the endpoint went: its connections with it
    assert not t.conns.conns()
    assert back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=1234, flags="SA"))[0] is None


def test_a_peered_vpcs_vm_reaches_the_endpoint_and_is_answered_in_its_own_vni() -> None:
    """Distributed peering: the peer's vSwitch tunnels with the endpoint VPC's VNI (100); the replies, the ping's
    answer and ICMP errors go back in the peer's (300). A source in no peer goes back in the endpoint's VNI."""
    t = table(served("e1", 100, "100.100.1.1", peers=[{"cidr": "10.9.0.0/16", "vni": 300}]))
    _, p = out(t, 100, IP(src="10.9.0.7", dst=EP_IP) / TCP(sport=40000, dport=80, flags="S"))
    assert (p.src, p.dst) == ("100.100.1.1", SVC)
    v, r = back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=40000, flags="SA"))
    assert (v.direction, v.vni, v.ip, r.dst) == ("in", 300, ip2int("10.9.0.7"), "10.9.0.7")
    v, _ = out(t, 100, IP(src="10.9.0.7", dst=EP_IP) / ICMP(type=8, id=7, seq=1) / b"ping")
    assert (v.direction, v.vni) == ("in", 300)
    unreachable = IP(src=SVC, dst="100.100.1.1") / ICMP(type=3, code=3) / Raw(bytes(p)[:28])
    v, _ = back(t, unreachable)
    assert (v.direction, v.vni, v.ip) == ("in", 300, ip2int("10.9.0.7"))
    _, p = out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=40001, dport=80, flags="S"))
    assert back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=40001, flags="SA"))[0].vni == 100


def test_a_peer_is_admitted_only_where_the_endpoints_rules_say() -> None:
    rules = [{"protocol": "tcp", "port_min": 80, "port_max": 80, "cidrs": ["10.0.0.0/16"]}]
    t = table(served("e1", 100, "100.100.1.1", rules=rules, peers=[{"cidr": "10.9.0.0/16", "vni": 300}]))
    assert out(t, 100, IP(src="10.9.0.7", dst=EP_IP) / TCP(sport=40000, dport=80, flags="S"))[0] is None
    assert t.counters["drop_security_group"] == 1


def test_the_endpoint_answers_ping() -> None:
    t = table(served("e1", 100, "100.100.1.1"))
    v, p = out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / ICMP(type=8, id=7, seq=1) / b"ping")
    assert (v.direction, v.vni, p.src, p.dst, p[ICMP].type) == ("in", 100, EP_IP, "10.0.1.5", 0)
    assert ICMP(bytes(p[ICMP])).chksum == p[ICMP].chksum


def test_proxy_protocol_v2_heads_the_stream_and_sequence_numbers_follow() -> None:
    t = table(served("e-77", 100, "100.100.1.1", proxy=True))
    vm = IP(src="10.0.1.5", dst=EP_IP)
    # a stream must begin here: a mid-stream segment of an unknown connection is refused
    assert out(t, 100, vm / TCP(sport=40000, dport=80, flags="A", seq=5))[0] is None
    _, syn = out(t, 100, vm / TCP(sport=40000, dport=80, flags="S", seq=1000,
                                  options=[("MSS", 1410), ("SAckOK", b"")]))
    assert ("SAckOK", b"") not in syn[TCP].options
    _, sa = back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=40000, flags="SA", seq=5000, ack=1001,
                                                          options=[("MSS", 1460)]))
    hdr = pp.header(ip2int("10.0.1.5"), 40000, ip2int(EP_IP), 80, "e-77")
    assert sa[TCP].ack == 1001 and dict(sa[TCP].options)["MSS"] == 1450 - 40 - len(hdr)
    _, ack = out(t, 100, vm / TCP(sport=40000, dport=80, flags="A", seq=1001, ack=5001))
    got = pp.parse(bytes(ack[TCP].payload))
    assert got is not None and got["tlvs"][pp.PP2_TYPE_AWS] == b"\x01e-77" and got["src"] == ip2int("10.0.1.5")
    assert got["dst"] == ip2int(EP_IP) and (got["sport"], got["dport"]) == (40000, 80)
    _, data = out(t, 100, vm / TCP(sport=40000, dport=80, flags="PA", seq=1001, ack=5001) / b"GET /")
    assert bytes(data[TCP].payload) == hdr + b"GET /" and data[TCP].seq == 1001  # the header not acked yet
    _, a = back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=40000, flags="A", seq=5001,
                                                         ack=1001 + len(hdr) + 5))
    assert a[TCP].ack == 1006
    _, more = out(t, 100, vm / TCP(sport=40000, dport=80, flags="PA", seq=1006, ack=5001) / b"x")
    assert more[TCP].seq == 1006 + len(hdr) and bytes(more[TCP].payload) == b"x"
    _, again = out(t, 100, vm / TCP(sport=40000, dport=80, flags="PA", seq=1001, ack=5001) / b"GET /")
    assert again[TCP].seq == 1001 + len(hdr) and bytes(again[TCP].payload) == b"GET /"  # a retransmission
    for p in (syn, ack, data, more, a):
        q = IP(bytes(p))
        del q[TCP].chksum, q.chksum
        assert IP(bytes(q))[TCP].chksum == p[TCP].chksum and IP(bytes(q)).chksum == p.chksum


def test_proxy_protocol_v2_heads_every_udp_datagram_and_the_answers_come_back_as_they_are() -> None:
    t = table(served("e-88", 100, "100.100.1.1", proxy=True))
    for i, body in enumerate((b"query-1", b"query-two")):
        _, p = out(t, 100, IP(src="10.0.1.5", dst=EP_IP, id=77 + i) / UDP(sport=5353, dport=53) / body)
        data = bytes(p)[20 + 8:]  # not scapy's payload: port 53 would be parsed as DNS
        got = pp.parse(data)
        assert got is not None and got["transport"] == "udp"
        assert (got["src"], got["sport"], got["dst"], got["dport"]) == (ip2int("10.0.1.5"), 5353, ip2int(EP_IP), 53)
        assert got["tlvs"][pp.PP2_TYPE_AWS] == b"\x01e-88"
        assert data[got["length"]:] == body
        assert (p.id, p.len, p[UDP].len) == (77 + i, 20 + 8 + got["length"] + len(body), 8 + got["length"] + len(body))
        again = IP(bytes(p))
        del again.chksum, again[UDP].chksum
        assert (IP(bytes(again)).chksum, IP(bytes(again))[UDP].chksum) == (p.chksum, p[UDP].chksum)
    v, r = back(t, IP(src=SVC, dst="100.100.1.1") / UDP(sport=53, dport=5353) / b"answer")
    assert (v.vni, r.dst, r[UDP].dport, bytes(r)[28:]) == (100, "10.0.1.5", 5353, b"answer")


def test_bigger_than_the_vpc_mtu_is_cut_or_refused() -> None:
    t = table(served("e1", 100, "100.100.1.1"))
    out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / UDP(sport=5000, dport=53))
    v, _ = back(t, IP(src=SVC, dst="100.100.1.1") / UDP(sport=53, dport=5000) / Raw(b"a" * 1472))
    assert v.direction == "in" and len(v.fragments) == 2 and all(len(f) <= 1450 for f in v.fragments)
    v, err = back(t, IP(src=SVC, dst="100.100.1.1", flags="DF") / UDP(sport=53, dport=5000) / Raw(b"a" * 1472))
    assert v.direction == "out" and err[ICMP].type == 3 and err[ICMP].code == 4 and err.dst == SVC
    assert struct.unpack("!H", bytes(err[ICMP])[6:8])[0] == 1450


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.integers(0, 3))
def test_garbage_never_raises(data: bytes, where: int) -> None:
    t = table(served("e1", 100, "100.100.1.1", proxy=True))
    base = bytes(IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=40000, dport=80, flags="S"))
    buf = bytearray(base[:where * 10] + data if where else data)
    t.outbound(100, buf, 0.0)
    t.inbound(bytearray(data), 0.0)


def test_a_published_load_balancer_is_reached_in_its_own_vpc_and_answers_from_there() -> None:
    """Endpoint of a tenant's load balancer: the VM's packet goes into the provider's VNI to the VIP, from the
    endpoint's provider port; the member's answer (from the VIP, in that VNI) comes back to the VM."""
    x = served("e1", 100, "10.9.1.50").model_copy(update={"addresses": ["10.9.1.100"], "ports": [], "via_vni": 900})
    t = table(x)
    v, p = out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=40000, dport=8443, flags="S"))
    assert (v.direction, v.vni, v.ip) == ("in", 900, ip2int("10.9.1.100"))  # any port: its listeners decide
    assert (p.src, p.dst, p[TCP].dport) == ("10.9.1.50", "10.9.1.100", 8443)
    reply = IP(src="10.9.1.100", dst="10.9.1.50") / TCP(sport=8443, dport=40000, flags="SA")
    assert t.outbound(100, bytearray(bytes(reply)), 0.0) is None  # not from the provider's VNI
    buf = bytearray(bytes(reply))
    v = t.outbound(900, buf, 0.0)
    r = IP(bytes(buf))
    assert (v.direction, v.vni, v.ip, r.src, r.dst, r[TCP].sport) == ("in", 100, ip2int("10.0.1.5"), EP_IP,
                                                                      "10.0.1.5", 8443)
    assert out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / ICMP())[0] is not None  # ping is the endpoint's


def test_icmp_errors_from_the_service_reach_the_vm_about_its_own_packet() -> None:
    """Port unreachable from the service, about the endpoint's translated datagram: the VM gets it from the
    endpoint, quoting its own addresses and port (as it sent them); an error about no connection is dropped."""
    t = table(served("e1", 100, "100.100.1.1"))
    _, sent = out(t, 100, IP(src="10.0.1.5", dst=EP_IP) / UDP(sport=5353, dport=53) / b"q")
    err = IP(src=SVC, dst="100.100.1.1") / ICMP(type=3, code=3) / bytes(sent)[:28]
    v, got = back(t, err)
    assert (v.direction, v.vni, v.ip) == ("in", 100, ip2int("10.0.1.5"))
    assert (got.src, got.dst, got[ICMP].type, got[ICMP].code) == (EP_IP, "10.0.1.5", 3, 3)
    quoted = IP(bytes(got[ICMP].payload))
    assert (quoted.src, quoted.dst, quoted[UDP].sport, quoted[UDP].dport) == ("10.0.1.5", EP_IP, 5353, 53)
    assert ICMP(bytes(got[ICMP])).chksum == got[ICMP].chksum
    q = IP(bytes(got[ICMP].payload))
    del q.chksum
    assert IP(bytes(q)).chksum == quoted.chksum  # the quoted header's own checksum made right
    stray = IP(src=SVC, dst="100.100.1.1") / ICMP(type=3, code=3) / bytes(
        IP(src="100.100.1.1", dst=SVC) / UDP(sport=9, dport=53))[:28]
    assert back(t, stray)[0] is None


def test_a_change_of_the_endpoints_rules_keeps_its_connections_a_change_of_its_source_ends_them() -> None:
    """A new port in the endpoint's groups changes its rules at every write: what is established goes on (as the
    vSwitch's conntrack keeps it); an endpoint that now leaves from another source cannot carry them."""
    t = table(served("e1", 100, "100.100.1.1"))
    syn = IP(src="10.0.1.5", dst=EP_IP) / TCP(sport=40000, dport=80, flags="S")
    assert out(t, 100, syn)[0].direction == "out"
    t.update_vpc(100, (endpoint_of(served("e1", 100, "100.100.1.1", rules=[
        {"protocol": "tcp", "port_range_min": 80, "port_range_max": 80, "cidrs": ["10.0.1.0/24"]}])),))
    v, r = back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=40000, flags="SA"))
    assert v is not None and (r.dst, r[TCP].dport) == ("10.0.1.5", 40000)
    assert t.conns.find_in((100, ip2int("10.0.1.5"), 40000, 6, ip2int(EP_IP), 80)).ep is t.by_vni[100][0]
    t.update_vpc(100, (endpoint_of(served("e1", 100, "100.100.1.2")),))
    assert back(t, IP(src=SVC, dst="100.100.1.1") / TCP(sport=80, dport=40000, flags="A"))[0] is None
    assert len(t.conns) == 0
