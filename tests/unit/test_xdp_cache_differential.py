"""The XDP flow cache (native/tj_xdp.bpf.c) against the C stage whose rewrites it repeats (dp_svc.c), frame for frame.

test_service_differential's instance (the C stage on the memory backend, two tenants with identical addresses, a
published load balancer, a peered VPC) hands the cache every connection direction after its first packet here
(`dp_set_cache_after(1)`); the memory backend keeps what it was handed. Before each frame of Hypothesis's sequences
the cache's program (the one the xdp backend attaches, loaded and run by the kernel: BPF_PROG_TEST_RUN) is run on
that frame with each flow the cache then held for its port. Whatever the program sends on must be byte for byte what
the C stage sent, out of the same port (XDP_TX) or the other (XDP_REDIRECT); everything else it must leave to the
loop (XDP_PASS), and a frame the C stage carried for a flow the cache held it must carry itself (but TCP SYN, FIN
and RST: the loop tracks the connection's state from those).
"""

from __future__ import annotations

import ctypes
import struct
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from nfv_gateways.core.instance import EXT, UL
from nfv_gateways.native.api import NATIVE
from tests.unit.test_service_differential import (
    EP,
    EXT_MAC,
    HOW,
    SRC1,
    SRC2,
    SVC,
    SVC_MAC,
    VM,
    Pair,
    config,
    frames,
    l4,
    mutate,
    vxlan,
    warm,
)

XDP_PASS, XDP_TX, XDP_REDIRECT = 2, 3, 4
TJ_XDP_VLAN = 1 << 24  # include/tj_xdp.h
OBJ = str(NATIVE / "_tj_xdp.o")
Flow = tuple[int, bytes, bytes]  # the port it arrives on, its key, its action (include/tj_xdp.h)


def held(p: Pair) -> list[Flow]:
    out, port = [], ctypes.c_uint8()
    for i in range(64):
        key, act = ctypes.create_string_buffer(64), ctypes.create_string_buffer(256)
        if p.dp.lib.dp_mem_flow(p.dp.h, i, ctypes.byref(port), key, act) != 0:
            return out
        out.append((port.value, key.raw[:24], act.raw))
    return out


def key_of(port: int, frame: bytes) -> bytes | None:
    """The frame's key as the program reads it (VXLAN's outer source and VNI on the underlay port, the VLAN of a
    tagged frame on the other), if it is a packet the cache carries: not a TCP SYN, FIN or RST (those change the
    connection's state, C's), nor one whose TTL runs out."""
    tagged = port != UL and frame[12:14] == b"\x81\x00"
    ip = 64 if port == UL else 18 if tagged else 14
    if len(frame) < ip + 28 or frame[ip + 9] not in (6, 17) or frame[ip + 8] <= 1:
        return None
    if frame[ip + 9] == 6 and (len(frame) < ip + 40 or frame[ip + 33] & 0x07):
        return None
    vtep, vni = (frame[26:30], int.from_bytes(frame[46:49], "big")) if port == UL else \
        (bytes(4), TJ_XDP_VLAN | int.from_bytes(frame[14:16], "big") & 0xfff if tagged else 0)
    return vtep + struct.pack("=I", vni) + frame[ip + 12:ip + 20] + frame[ip + 20:ip + 24] + bytes([frame[ip + 9]]) \
        + bytes(3)


def run(xdp: ctypes.CDLL, flow: Flow, frame: bytes) -> tuple[int, bytes]:
    out, n = ctypes.create_string_buffer(4096), ctypes.c_uint32(4096)
    action = xdp.dp_xdp_test(OBJ.encode(), flow[0], flow[1], flow[2], frame, len(frame), out, ctypes.byref(n))
    assert action >= 0, "the kernel would not load or run the cache's program"
    return action, out.raw[:n.value]


def check(xdp: ctypes.CDLL, flows: list[Flow], port: int, frame: bytes, native: list, in_c: bool) -> int:
    """The program on `frame` with the flow held for its key (if any) and another one of its port against what the C
    stage did; 1 if it carried it."""
    carried, key = 0, key_of(port, frame)
    if len(frame) < 14:  # no Ethernet header: never handed to XDP (the kernel's test run refuses it too)
        return 0
    mine = [f for f in flows if f[0] == port and f[1] == key]
    for flow in mine + [f for f in flows if f[0] == port and f[1] != key][:1]:
        action, out = run(xdp, flow, frame)
        if action == XDP_PASS:
            assert not (in_c and flow[1] == key), f"C carried a frame of a flow the cache holds: {frame.hex()}"
            continue
        assert action in (XDP_TX, XDP_REDIRECT) and in_c and len(native) == 1, (action, frame.hex())
        assert (action == XDP_TX) == (native[0][0] == port)
        assert out == native[0][1], f"\n xdp {out.hex()}\n   c {native[0][1].hex()}"
        carried += 1
    return carried


def replay(xdp: ctypes.CDLL, p, seq: list[tuple[int, bytes]], carried: tuple[str, str]) -> None:
    """Each frame through both instances (identical output), and the program on it with the flows held before it
    against what C did; `carried`: the stage's counters of frames it carried itself."""
    for port, frame in seq:
        flows, before = held(p), p.dp.stats()
        native, ref = p.step(port, frame)
        assert native == ref
        after = p.dp.stats()
        in_c = after["punt"] == before["punt"] and sum(after[c] for c in carried) > sum(before[c] for c in carried)
        check(xdp, flows, port, frame, native, in_c)


def established(p: Pair) -> None:
    """Connections for the sequences to hit: each VM's TCP and UDP from both source ports to the endpoint and to
    the published load balancer's (the frames' own strategies rarely open one and then use it)."""
    for (vni, ip), (mac, hv) in VM.items():
        for ep in (EP, "10.0.1.10"):
            for proto, dport, flags in (("tcp", 80, "S"), ("tcp", 80, "A"), ("tcp", 80, "A"), ("udp", 53, ""),
                                        ("udp", 53, "")):
                for sport in (40000, 40001):
                    p.step(UL, vxlan(hv, vni, bytes(Ether(src=mac, dst="02:09:00:00:00:09") / IP(src=ip, dst=ep)
                                                    / l4(proto, sport, dport, flags, 0))))
    for src in (SRC1, SRC2):  # the service's answers: each way of each connection is the cache's from the start
        for proto, sport in (("tcp", 80), ("udp", 53)):
            for dport in (40000, 40001):
                p.step(EXT, bytes(Ether(src=SVC_MAC, dst=EXT_MAC) / IP(src=SVC, dst=src) / l4(proto, sport, dport, "A",
                                                                                               0)))


SIZES = st.sampled_from([0, 0, 100, 1372, 1373, 1400, 1472])  # around the VPC's MTU (1450) and the service's (1500)
FLAGS = st.sampled_from(["A", "A", "PA", "PA", "FA", "R", "S", "SA", "PAU"])
on_established = st.one_of(  # frames of the connections `established` opened, mostly ones the cache may carry
    st.builds(lambda who, ep, proto, sport, flags, ttl, size, how: (UL, mutate(vxlan(
        VM[who][1], who[0], bytes(Ether(src=VM[who][0], dst="02:09:00:00:00:09") / IP(src=who[1], dst=ep, ttl=ttl)
                                  / l4(proto, sport, 80 if proto == "tcp" else 53, flags, size))), how)),
        st.sampled_from(list(VM)), st.sampled_from([EP, "10.0.1.10"]), st.sampled_from(["tcp", "tcp", "udp"]),
        st.sampled_from([40000, 40001]), FLAGS, st.sampled_from([64, 64, 64, 2, 1]), SIZES, HOW),
    st.builds(lambda src, proto, dport, flags, ttl, size, how: (EXT, mutate(bytes(
        Ether(src=SVC_MAC, dst=EXT_MAC) / IP(src=SVC, dst=src, ttl=ttl)
        / l4(proto, 80 if proto == "tcp" else 53, dport, flags, size)), how)),
        st.sampled_from([SRC1, SRC2]), st.sampled_from(["tcp", "tcp", "udp"]), st.sampled_from([40000, 40001]),
        FLAGS, st.sampled_from([64, 64, 64, 2, 1]), SIZES, HOW))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.lists(st.one_of(on_established, on_established, on_established, frames.map(lambda f: f[0])),
                    min_size=1, max_size=40))
def test_the_cache_does_what_the_c_stage_did(xdp: ctypes.CDLL, tmp_path: Path, seq: list[tuple[int, bytes]]) -> None:
    p = Pair(tmp_path)
    try:
        p.dp.lib.dp_set_cache_after(p.dp.h, 1)
        warm(p)
        established(p)
        replay(xdp, p, seq, ("svc_in", "svc_out"))
    finally:
        p.close()


def test_an_established_connection_is_carried_by_the_cache_until_it_ends(xdp: ctypes.CDLL, tmp_path: Path) -> None:
    """After 8 packets a way in C, each way of a connection is the cache's, carried as C carried it; a change to the
    VPC's forwarding takes them back (they were made from it), and so does the connection's end (its timeout)."""
    p = Pair(tmp_path)
    try:
        warm(p)
        vm = VM[(1001, "10.0.1.5")]

        def from_vm(flags: str) -> tuple[int, bytes]:
            return UL, vxlan("hv1", 1001, bytes(Ether(src=vm[0], dst="02:09:00:00:00:09")
                                                / IP(src="10.0.1.5", dst=EP) / TCP(sport=40000, dport=80, flags=flags)
                                                / b"x"))

        back = (EXT, bytes(Ether(src=SVC_MAC, dst="02:aa:00:00:00:02") / IP(src=SVC, dst="100.100.128.1")
                           / TCP(sport=80, dport=40000, flags="A") / b"y"))
        for flags in ("S", "A"):  # admitted by Python; the ACK that establishes is C's first
            p.step(*from_vm(flags))
        for _ in range(7):
            assert held(p) == []
            p.step(*from_vm("PA"))
            p.step(*back)
        assert [f[0] for f in held(p)] == [UL]  # 8 to the service (the ACK and 7), 7 back
        p.step(*back)
        flows = held(p)
        assert sorted(f[0] for f in flows) == [UL, EXT]
        for frame in (from_vm("PA"), back):
            native, _ = p.step(*frame)
            assert check(xdp, flows, frame[0], frame[1], native, True) == 1
        p.native.apply(config())  # the same config again: nothing changes, nothing is taken back
        assert len(held(p)) == 2
        p.dp.lib.dp_set_vpc(p.dp.h, 1002, bytes.fromhex("020000001002"), None, 0)
        assert len(held(p)) == 2  # another VPC's forwarding: not what these flows were made from
        p.dp.lib.dp_set_vpc(p.dp.h, 1001, bytes.fromhex("020000001001"), None, 0)
        assert held(p) == []  # VPC 1001's changed: its connections' flows are the C stage's again
        p.step(*from_vm("PA"))
        assert [f[0] for f in held(p)] == [UL]  # carried 8 before: the cache has the way to the service again
        p.step(*from_vm("R"))
        assert len(held(p)) == 1  # closing: its packets are still carried until it times out
        assert p.native.stage.expire(time.time() + 60) == 0
        assert p.native.stage.expire(time.time() + 200) == 1 and held(p) == []  # gone, and from the cache too
    finally:
        p.close()
