"""The router's IPv6 answers built by the agent (router advertisements, DHCPv6, time exceeded), read back by
scapy, an independent implementation: fields as RFC 4861 / 8415 / 4443 place them, checksums valid; and no frame,
however malformed, raises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.dhcp6 import (
    DUID_LL,
    DHCP6_Advertise,
    DHCP6_Reply,
    DHCP6_Request,
    DHCP6_Solicit,
    DHCP6OptClientId,
    DHCP6OptIA_NA,
    DHCP6OptIAAddress,
    DHCP6OptRapidCommit,
    DHCP6OptServerId,
)
from scapy.layers.inet import TCP, UDP
from scapy.layers.inet6 import (
    ICMPv6ND_RA,
    ICMPv6ND_RS,
    ICMPv6NDOptMTU,
    ICMPv6NDOptPrefixInfo,
    ICMPv6NDOptSrcLLAddr,
    ICMPv6PacketTooBig,
    ICMPv6TimeExceeded,
    IPv6,
)
from scapy.layers.l2 import Ether

from vswitch_agent import dhcp6, icmp6

ROUTER_MAC, VM_MAC = "0a:58:00:00:03:e8", "52:54:00:12:34:56"
PREFIX = "fd00:7469:0:100::/64"
VM_LL = "fe80::5054:ff:fe12:3456"


def checksum_ok(pkt, layer) -> bool:
    field = "chksum" if layer is UDP else "cksum"
    got = getattr(pkt[layer], field)
    again = Ether(bytes(pkt))
    delattr(again[layer], field)
    return getattr(Ether(bytes(again))[layer], field) == got


def test_a_router_solicitation_is_answered_with_the_subnets_advertisement() -> None:
    rs = Ether(src=VM_MAC, dst="33:33:00:00:00:02") / IPv6(src=VM_LL, dst="ff02::2", hlim=255) / ICMPv6ND_RS()
    out = Ether(icmp6.answer_rs(bytes(rs), ROUTER_MAC, PREFIX, 1450, "slaac"))
    ra = out[ICMPv6ND_RA]
    assert (out.src, out.dst) == (ROUTER_MAC, VM_MAC)
    assert (out[IPv6].src, out[IPv6].dst, out[IPv6].hlim) == ("fe80::858:ff:fe00:3e8", VM_LL, 255)
    assert (ra.M, ra.O, ra.routerlifetime) == (0, 0, icmp6.ROUTER_LIFETIME_S)
    pi = out[ICMPv6NDOptPrefixInfo]
    assert (pi.prefix, pi.prefixlen, pi.L, pi.A) == ("fd00:7469:0:100::", 64, 1, 1)
    assert out[ICMPv6NDOptMTU].mtu == 1450 and out[ICMPv6NDOptSrcLLAddr].lladdr == ROUTER_MAC
    assert checksum_ok(out, ICMPv6ND_RA)
    stateful = Ether(icmp6.router_advertisement(ROUTER_MAC, PREFIX, 1450, "dhcpv6-stateful"))
    assert (stateful[ICMPv6ND_RA].M, stateful[ICMPv6ND_RA].O, stateful[ICMPv6NDOptPrefixInfo].A) == (1, 1, 0)
    assert (stateful.dst, stateful[IPv6].dst) == ("33:33:00:00:00:01", "ff02::1")
    forwarded = rs.copy()
    forwarded[IPv6].hlim = 254
    assert icmp6.answer_rs(bytes(forwarded), ROUTER_MAC, PREFIX, 1450, "slaac") is None  # ND is never routed


def ask(msg_cls, *opts, trid=0x123456):
    pkt = Ether(src=VM_MAC, dst="33:33:00:01:00:02") / IPv6(src=VM_LL, dst="ff02::1:2") / UDP(sport=546, dport=547)
    body = msg_cls(trid=trid)
    for o in opts:
        body = body / o
    return bytes(pkt / body)


def test_dhcpv6_gives_the_address_the_api_shows() -> None:
    cid = DHCP6OptClientId(duid=DUID_LL(lladdr=VM_MAC))
    sid = DHCP6OptServerId(duid=DUID_LL(lladdr=ROUTER_MAC))
    addr = "fd00:7469:0:100::2"
    adv = Ether(dhcp6.reply(ask(DHCP6_Solicit, cid, DHCP6OptIA_NA(iaid=7)), address=addr, router_mac=ROUTER_MAC))
    assert DHCP6_Advertise in adv and adv[DHCP6_Advertise].trid == 0x123456
    assert adv[DHCP6OptIA_NA].iaid == 7 and adv[DHCP6OptIAAddress].addr == addr
    assert adv[DHCP6OptServerId].duid.lladdr == ROUTER_MAC and adv[DHCP6OptClientId].duid.lladdr == VM_MAC
    assert (adv[IPv6].src, adv[IPv6].dst, adv[UDP].sport, adv[UDP].dport) == ("fe80::858:ff:fe00:3e8", VM_LL, 547, 546)
    assert checksum_ok(adv, UDP)
    rapid = Ether(dhcp6.reply(ask(DHCP6_Solicit, cid, DHCP6OptRapidCommit(), DHCP6OptIA_NA(iaid=7)), address=addr,
                              router_mac=ROUTER_MAC))
    assert DHCP6_Reply in rapid and DHCP6OptRapidCommit in rapid and rapid[DHCP6OptIAAddress].addr == addr
    rep = Ether(dhcp6.reply(ask(DHCP6_Request, cid, sid, DHCP6OptIA_NA(iaid=7)), address=addr, router_mac=ROUTER_MAC))
    assert DHCP6_Reply in rep and rep[DHCP6OptIAAddress].addr == addr
    other = DHCP6OptServerId(duid=DUID_LL(lladdr="02:00:00:00:00:01"))
    assert dhcp6.reply(ask(DHCP6_Request, cid, other, DHCP6OptIA_NA(iaid=7)), address=addr,
                       router_mac=ROUTER_MAC) is None  # another server's
    assert dhcp6.reply(ask(DHCP6_Solicit, DHCP6OptIA_NA(iaid=7)), address=addr, router_mac=ROUTER_MAC) is None


def test_time_exceeded_quotes_the_packet_from_the_router() -> None:
    pkt = Ether(src=VM_MAC, dst=ROUTER_MAC) / IPv6(src="fd00:7469:0:100::2", dst="fd00:7469:0:200::9", hlim=1) / \
        UDP(sport=1234, dport=33434) / (b"x" * 2000)
    out = Ether(icmp6.time_exceeded(bytes(pkt), ROUTER_MAC, "fd00:7469:0:100::1"))
    assert (out[IPv6].src, out[IPv6].dst) == ("fd00:7469:0:100::1", "fd00:7469:0:100::2")
    assert out[ICMPv6TimeExceeded].code == 0 and len(bytes(out[IPv6])) <= 1280
    assert checksum_ok(out, ICMPv6TimeExceeded)
    assert icmp6.time_exceeded(bytes(out), ROUTER_MAC, "fd00:7469:0:100::1") is None  # not about an error


def test_packet_too_big_tells_the_vm_the_path_mtu() -> None:
    pkt = Ether(src=ROUTER_MAC, dst=ROUTER_MAC) / IPv6(src="fd00:7469:0:100::2", dst="fd07::9", hlim=63) / \
        TCP(sport=1234, dport=80) / (b"x" * 1400)  # its source MAC already the router's: the switch rewrote it
    out = Ether(icmp6.packet_too_big(bytes(pkt), 1280, ROUTER_MAC, VM_MAC, "fd00:7469:0:100::1"))
    assert out.dst == VM_MAC and (out[IPv6].src, out[IPv6].dst) == ("fd00:7469:0:100::1", "fd00:7469:0:100::2")
    assert out[ICMPv6PacketTooBig].mtu == 1280 and len(bytes(out[IPv6])) <= 1280
    assert checksum_ok(out, ICMPv6PacketTooBig)
    assert icmp6.packet_too_big(bytes(out), 1280, ROUTER_MAC, VM_MAC, "fd00::1") is None  # not about an error


@given(st.binary(max_size=400))
def test_no_frame_raises(data: bytes) -> None:
    for frame in (data, bytes.fromhex("525400123456") + bytes(6) + b"\x86\xdd" + data):
        icmp6.answer_rs(frame, ROUTER_MAC, PREFIX, 1450, "slaac")
        icmp6.time_exceeded(frame, ROUTER_MAC, "fd00::1")
        icmp6.packet_too_big(frame, 1280, ROUTER_MAC, VM_MAC, "fd00::1")
        dhcp6.reply(frame, address="fd00::2", router_mac=ROUTER_MAC)


def test_each_plugged_port_of_a_dual_stack_subnet_is_advertised_to_once_when_plugged() -> None:
    from tests.unit.test_flows6 import config
    from vswitch_agent.adverts import Fresh, adverts

    cfg = config()
    got = adverts(cfg, {"a1": 1, "a2": 2})
    assert [(pid, of) for pid, of, _ in got] == [("a1", 1), ("a2", 2)]
    ra = Ether(got[1][2])
    assert ra.dst == "02:00:00:00:00:a2" and ra[ICMPv6ND_RA].M == 1  # a2's subnet is DHCPv6-stateful
    fresh = Fresh()
    assert [of for of, _ in fresh.take(cfg, {"a1": 1})] == [1]
    assert [of for of, _ in fresh.take(cfg, {"a1": 1, "a2": 2})] == [2]
    assert fresh.take(cfg, {"a1": 1, "a2": 2}) == []
    assert [of for of, _ in fresh.take(cfg, {"a1": 7, "a2": 2})] == [7]  # plugged again
    assert adverts(config(dual=False), {"a1": 1, "a2": 2}) == []
