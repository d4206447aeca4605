"""The VPC's resolver (vswitch_agent/dns.py, dns_forward.py): endpoint names answered from the config, other names
of the zone NXDOMAIN, the rest forwarded to the operator's resolver (answers back to the VM that asked, with its
own id) or refused; malformed input is ignored, never an exception."""

from __future__ import annotations

import socket
import threading
import time

from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.dns import DNS, DNSQR, DNSRR
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from tianji.inet import checksum
from tianji.southbound import DnsRecord, HostConfig, PortInfo, SubnetInfo, VpcInfo
from vswitch_agent import dhcp, dns, punts
from vswitch_agent.dns_forward import Forwarder, parse_server

ROUTER = "0a:58:00:00:03:e9"
VM_MAC = "02:00:00:00:00:a1"
CFG = HostConfig(host="hv1", revision=1, ports=[PortInfo(id="p1", vpc_id="A", subnet_id="s1", mac=VM_MAC,
                                                         ip="10.0.1.2")],
                 vpcs=[VpcInfo(id="A", tenant_id="t", vni=1001, cidr="10.0.0.0/16", router_mac=ROUTER,
                               subnets=[SubnetInfo(id="s1", cidr="10.0.1.0/24", gateway_ip="10.0.1.1")],
                               dns=[DnsRecord(name="store.prod.internal", address="10.0.1.7")])])


def query(name: str, qtype: str = "A", ident: int = 4242) -> bytes:
    return bytes(Ether(src=VM_MAC, dst=ROUTER) / IP(src="10.0.1.2", dst="10.0.1.1") / UDP(sport=33333, dport=53)
                 / DNS(id=ident, rd=1, qd=DNSQR(qname=name, qtype=qtype)))


def answer_of(frame: bytes) -> DNS:
    pkt = Ether(frame)
    assert pkt[Ether].dst == VM_MAC and pkt[Ether].src == ROUTER
    assert pkt[IP].src == "10.0.1.1" and pkt[IP].dst == "10.0.1.2" and pkt[UDP].sport == 53
    assert pkt[UDP].dport == 33333
    assert checksum(frame[14:34]) == 0  # the header's checksum holds
    return pkt[DNS]


def test_an_endpoint_name_is_answered_with_its_address() -> None:
    a = answer_of(punts.dns_answer(CFG, "p1", dns.parse(query("Store.Prod.Internal.")), None))
    assert a.id == 4242 and a.qr == 1 and a.aa == 1 and a.rcode == 0 and a.ancount == 1
    assert a.an[0].rdata == "10.0.1.7" and a.an[0].ttl == dns.TTL and a.qd[0].qname == b"Store.Prod.Internal."


def test_other_names_of_the_zone_do_not_exist_and_other_types_have_no_data() -> None:
    a = answer_of(punts.dns_answer(CFG, "p1", dns.parse(query("db.prod.internal.")), None))
    assert a.rcode == dns.RCODE_NXDOMAIN and a.ancount == 0
    a = answer_of(punts.dns_answer(CFG, "p1", dns.parse(query("store.prod.internal.", "AAAA")), None))
    assert a.rcode == 0 and a.ancount == 0


def test_names_outside_the_zone_are_refused_without_a_forwarder() -> None:
    a = answer_of(punts.dns_answer(CFG, "p1", dns.parse(query("example.com.")), None))
    assert a.rcode == dns.RCODE_REFUSED and a.ancount == 0


def test_names_outside_the_zone_go_to_the_operators_resolver_and_back_with_the_vms_id() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    sent: list[tuple[int, bytes]] = []

    def resolver() -> None:  # answers example.com, and first sends a forged answer with another id
        msg, peer = server.recvfrom(4096)
        q = DNS(msg)
        server.sendto(bytes(DNS(id=(q.id + 1) % 65536, qr=1, qd=q.qd, an=DNSRR(rrname=q.qd[0].qname, rdata="6.6.6.6"))),
                      peer)
        server.sendto(bytes(DNS(id=q.id, qr=1, ra=1, qd=q.qd, an=DNSRR(rrname=q.qd[0].qname, rdata="93.184.216.34"))),
                      peer)

    threading.Thread(target=resolver, daemon=True).start()
    fwd = Forwarder(parse_server(f"127.0.0.1:{server.getsockname()[1]}"), lambda of, f: sent.append((of, f)))
    threading.Thread(target=fwd.run, daemon=True).start()
    assert punts.dns_answer(CFG, "p1", dns.parse(query("example.com.", ident=7)),
                            lambda q, mac: fwd.forward(q, 5, mac)) is None
    deadline = time.time() + 5
    while not sent and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the forged one, had it been taken, would be here too
    assert len(sent) == 1, sent
    ofport, frame = sent[0]
    a = answer_of(frame)
    assert ofport == 5 and a.id == 7 and a.an[0].rdata == "93.184.216.34"
    assert fwd.counters == {"forwarded": 1, "answered": 1, "dropped": 0} and not fwd.pending


def test_dhcp_names_the_gateway_as_dns_server() -> None:
    from scapy.layers.dhcp import BOOTP, DHCP

    disc = bytes(Ether(src=VM_MAC, dst="ff:ff:ff:ff:ff:ff") / IP(src="0.0.0.0", dst="255.255.255.255")
                 / UDP(sport=68, dport=67) / BOOTP(chaddr=bytes.fromhex(VM_MAC.replace(":", "")), xid=9)
                 / DHCP(options=[("message-type", "discover"), "end"]))
    offer = Ether(dhcp.reply(disc, ip="10.0.1.2", cidr="10.0.1.0/24", gateway_ip="10.0.1.1", router_mac=ROUTER,
                             mtu=1450))
    opts = dict(o for o in offer[DHCP].options if isinstance(o, tuple))
    assert opts["name_server"] == "10.0.1.1"


@given(st.binary(max_size=200))
def test_malformed_queries_are_ignored(tail: bytes) -> None:
    base = query("store.prod.internal.")
    for frame in (base[:42] + tail, base[:54] + tail, tail, base[:60] + tail):
        q = dns.parse(frame)
        if q is not None:
            out = punts.dns_answer(CFG, "p1", q, None)
            assert out is not None and Ether(out)[DNS].qr == 1
