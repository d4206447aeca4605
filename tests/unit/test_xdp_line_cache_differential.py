"""The XDP flow cache (native/tj_xdp.bpf.c) against the private line's C stage (dp_line.c), frame for frame.

test_line_dataplane_differential's instance (two tenants with identical addresses on two VLANs, static and learned
routes) runs the C stage on the memory backend, which keeps the flows the stage hands the cache: a line's flow from
the first packet C carries each way (it keeps no state to learn first). Before each frame of Hypothesis's sequences
the cache's program (loaded and run by the kernel: BPF_PROG_TEST_RUN) is run on that frame with each flow the cache
then held for its port: what it sends must be byte for byte what C sent (the tag pushed with the VXLAN header taken
off, or popped with it put on), out of the same port; the rest it leaves to the loop, and a frame of a held flow
that C carried it must carry itself (but those whose TTL runs out, or TCP SYN, FIN and RST: never the cache's).
"""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Dot1Q, Ether

from nfv_gateways.core.instance import EXT, UL
from nfv_gateways.core.packet import ip2int
from nfv_gateways.roles.line.reference import prefix_of
from tests.unit.test_dataplane_differential import mutate
from tests.unit.test_line_dataplane_differential import (
    CUSTOMER,
    HO_MAC,
    HV,
    LOCAL,
    R1,
    UL_MAC,
    VM,
    VTEP,
    Pair,
    frames,
    hv_arp,
    router_arp,
)
from tests.unit.test_xdp_cache_differential import XDP_PASS, check, held, replay, run

EPOCH_AT = 100  # tj_flow_act.epoch (include/tj_xdp.h)


def l4(proto: str, sport: int, flags: str, size: int) -> object:
    return (TCP(sport=sport, dport=443, flags=flags) if proto == "tcp" else UDP(sport=sport, dport=53)) / (b"x" * size)


SIZES = st.sampled_from([0, 0, 100, 1354, 1355, 1400, 1422, 1423])  # around the handoff's MTU (1400), the VPC's (1450)
HOW = st.sampled_from([("none", 0)] * 8 + [("truncate", 3), ("flip", 16), ("flip", 40), ("flip", 60), ("flip", 77)])
on_flows = st.one_of(  # frames of a few flows each way, mostly ones the cache may carry
    st.builds(lambda who, dst, proto, sport, flags, ttl, size, how: (UL, mutate(bytes(
        Ether(src=HV[VM[who][1]][1], dst=UL_MAC) / IP(src=HV[VM[who][1]][0], dst=VTEP) / UDP(sport=50000, dport=4789)
        / (b"\x08\0\0\0" + who[0].to_bytes(3, "big") + b"\0") / Ether(src=VM[who][0], dst=R1)
        / IP(src=who[1], dst=dst, ttl=ttl) / l4(proto, sport, flags, size)), how)),
        st.sampled_from(list(VM)), st.sampled_from(["192.168.20.7", "192.168.30.5", "192.168.30.200"]),
        st.sampled_from(["tcp", "tcp", "udp"]), st.sampled_from([40000, 40001]), st.sampled_from(["A", "PA", "S"]),
        st.sampled_from([64, 64, 64, 2, 1]), SIZES, HOW),
    st.builds(lambda vlan, dst, proto, sport, flags, ttl, size, how: (EXT, mutate(bytes(
        Ether(src=CUSTOMER[vlan], dst=HO_MAC) / Dot1Q(vlan=vlan) / IP(src="192.168.20.7", dst=dst, ttl=ttl)
        / l4(proto, sport, flags, size)), how)),
        st.sampled_from([100, 200]), st.sampled_from(["10.0.1.5", "10.0.1.9"]), st.sampled_from(["tcp", "tcp", "udp"]),
        st.sampled_from([40000, 40001]), st.sampled_from(["A", "PA", "FA"]), st.sampled_from([64, 64, 64, 2, 1]), SIZES,
        HOW))


def warm(p: Pair) -> None:
    for port, f in (hv_arp("hv1"), hv_arp("hv2"), router_arp(100), router_arp(200)):
        n, r = p.step(port, f)
        assert n == r


def handed(p: Pair) -> None:
    """A packet of each flow `on_flows` draws from, both ways: the cache holds them before the sequence starts."""
    for who in VM:
        for dst in ("192.168.20.7", "192.168.30.5", "192.168.30.200"):
            for proto in ("tcp", "udp"):
                for sport in (40000, 40001):
                    p.step(UL, bytes(Ether(src=HV[VM[who][1]][1], dst=UL_MAC) / IP(src=HV[VM[who][1]][0], dst=VTEP)
                                     / UDP(sport=50000, dport=4789) / (b"\x08\0\0\0" + who[0].to_bytes(3, "big")
                                                                       + b"\0")
                                     / Ether(src=VM[who][0], dst=R1) / IP(src=who[1], dst=dst)
                                     / l4(proto, sport, "A", 0)))
    for vlan in (100, 200):
        for dst in ("10.0.1.5", "10.0.1.9"):
            for proto in ("tcp", "udp"):
                for sport in (40000, 40001):
                    p.step(EXT, bytes(Ether(src=CUSTOMER[vlan], dst=HO_MAC) / Dot1Q(vlan=vlan)
                                      / IP(src="192.168.20.7", dst=dst) / l4(proto, sport, "A", 0)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.lists(st.one_of(on_flows, on_flows, on_flows, frames.map(lambda f: f[0])), min_size=1, max_size=40))
def test_the_cache_does_what_the_line_stage_did(xdp: ctypes.CDLL, tmp_path: Path,
                                                seq: list[tuple[int, bytes]]) -> None:
    p = Pair(tmp_path)
    try:
        warm(p)
        handed(p)
        replay(xdp, p, seq, ("line_out", "line_in"))
    finally:
        p.close()


def to_site(sport: int = 40000, dst: str = "192.168.30.200") -> tuple[int, bytes]:
    return UL, bytes(Ether(src=HV["hv1"][1], dst=UL_MAC) / IP(src=HV["hv1"][0], dst=VTEP)
                     / UDP(sport=50000, dport=4789) / (b"\x08\0\0\0" + (1001).to_bytes(3, "big") + b"\0")
                     / Ether(src=VM[(1001, "10.0.1.5")][0], dst=R1) / IP(src="10.0.1.5", dst=dst)
                     / TCP(sport=sport, dport=443, flags="PA") / b"x")


def from_site(vlan: int = 200) -> tuple[int, bytes]:
    return EXT, bytes(Ether(src=CUSTOMER[vlan], dst=HO_MAC) / Dot1Q(vlan=vlan) / IP(src="192.168.20.7", dst="10.0.1.5")
                      / UDP(sport=53, dport=40000) / b"y")


def test_a_flow_is_the_caches_from_its_first_packet_until_the_line_changes(xdp: ctypes.CDLL,
                                                                            tmp_path: Path) -> None:
    """Each way's first packet in C hands its flow over; the program then carries the rest as C did, and an
    entry of an older epoch is a miss. A change to the line's routes, or to its router's MAC, takes every flow
    back; the same MAC again, nothing."""
    p = Pair(tmp_path)
    try:
        warm(p)
        for frame in (to_site(), from_site()):
            assert not [f for f in held(p) if f[0] == frame[0]]
            native, _ = p.step(*frame)
            (flow,) = [f for f in held(p) if f[0] == frame[0]]
            assert check(xdp, [flow], frame[0], frame[1], native, True) == 1
            stale = flow[2][:EPOCH_AT] + struct.pack("=I", 1) + flow[2][EPOCH_AT + 4:]
            assert run(xdp, (flow[0], flow[1], stale), frame[1])[0] == XDP_PASS
        out, back = (Ether(run(xdp, f, fr[1])[1]) for f, fr in zip(held(p), (to_site(), from_site()), strict=True))
        assert out[Dot1Q].vlan == 100 and out[IP].ttl == 64  # the VM's hypervisor routed it: the TTL is left
        assert Ether(bytes(back[UDP].payload)[8:])[IP].ttl == 63 and bytes(back[UDP].payload)[4:7] == \
            (1002).to_bytes(3, "big")
        p.native.role.table.set_learned("line-100", ip2int(LOCAL), frozenset({prefix_of("192.168.30.0/24")}))
        assert held(p) == []  # VNI 1001's routes changed: every flow is the loop's again
        for frame in (to_site(), from_site()):
            p.step(*frame)
        assert len(held(p)) == 2
        p.step(*router_arp(100, op=2))  # the router again, same MAC: the flows stay
        assert len(held(p)) == 2
        p.step(*router_arp(100, op=2, mac="02:cc:00:00:01:99"))  # a new router's MAC: they go
        assert held(p) == []
    finally:
        p.close()


def test_a_flow_the_kernel_aged_out_is_handed_over_again(tmp_path: Path) -> None:
    """The cache's maps are LRUs: the kernel may drop a flow C still remembers handing over. Its frames then reach
    C again, and C hands it over again once the memo's window (frames queued before the hand-over) has passed."""
    import time

    p = Pair(tmp_path)
    try:
        warm(p)
        p.step(*to_site())
        p.step(*to_site())  # queued for the loop before the hand-over: not handed twice
        assert len(held(p)) == 1
        assert p.dp.lib.dp_mem_flow_forget(p.dp.h, 0) == 0  # the kernel's LRU ages it out
        p.step(*to_site())
        assert held(p) == []  # within the window: a frame queued before the hand-over, as far as C knows
        time.sleep(0.15)
        p.step(*to_site())
        assert len(held(p)) == 1 and held(p)[0][0] == UL
    finally:
        p.close()
