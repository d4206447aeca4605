"""Per-VPC configuration across the ctypes boundary: a change to one tenant crosses into C as that tenant's
records alone, and what C holds after any sequence of per-VPC changes is what the Python side holds (NAT
policies, the data plane's endpoints and router MACs, the load balancer's listeners)."""

from __future__ import annotations

import ctypes
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP

from nfv_gateways.core.instance import Instance
from nfv_gateways.core.packet import ip2int
from nfv_gateways.native.api import structure
from nfv_gateways.native.dataplane import NativeDataPlane
from nfv_gateways.roles.nat.native import FastNat
from nfv_gateways.roles.nat.policy import DnatRule, NatConfig, SnatRule, StaticEip, VpcNat
from tests.support.frames import lab_options
from tianji.served import LbListenerServed, LbMemberServed, LbServed
from tianji.southbound import (
    Endpoint,
    GatewayConfigDelta,
    GatewayHeld,
    GatewaySection,
    GatewayVpc,
    LbSection,
    NatSection,
    SnatInfo,
    Vtep,
    apply_gateway_delta,
)

VNIS = (1001, 1002, 1003)
EIPS = [ip2int(f"203.0.113.{i}") for i in range(1, 9)]
REMOTE = "198.51.100.7"


def policy(vni: int, n_static: int, n_dnat: int, eip_at: int) -> VpcNat:
    e = EIPS[eip_at % len(EIPS)]
    return VpcNat(vni, (SnatRule(vni, "10.0.0.0/16", (e,)),),
                  tuple(StaticEip(vni, ip2int(f"10.0.9.{i + 1}"), EIPS[(eip_at + 1 + i) % len(EIPS)])
                        for i in range(n_static)),
                  tuple(DnatRule(e, 17, 8000 + i, vni, ip2int(f"10.0.1.{i + 5}"), 80) for i in range(n_dnat)))


def c_out(fast: FastNat, vni: int, src: str, dst: str = REMOTE, sport: int = 5000) -> bytes | None:
    """What C alone does with a packet out: the translated bytes, or None (it declines: Python's)."""
    buf = bytearray(bytes(IP(src=src, dst=dst) / UDP(sport=sport, dport=53) / b"q"))
    raw = (ctypes.c_char * len(buf)).from_buffer(buf)
    r = fast.lib.nat_outbound(fast.h, vni, raw, len(buf), 1.0)
    del raw
    return bytes(buf) if r == 1 else None


ops = st.lists(st.tuples(st.sampled_from(VNIS), st.one_of(st.none(), st.tuples(
    st.integers(0, 2), st.integers(0, 2), st.integers(0, 7)))), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(ops)
def test_nat_policies_per_vpc_in_c_are_the_references(seq: list) -> None:
    fast = FastNat(NatConfig())
    try:
        for vni, p in seq:
            fast.update_vpc(vni, None if p is None else policy(vni, *p))
        ref = fast
        assert fast.lib.nat_vpc_count(fast.h) == len(ref.vpcs)
        for vni in VNIS:
            v = ref.vpcs.get(vni)
            for s in v.static if v else ():  # C translates a 1:1 EIP's packets itself, with that EIP
                got = c_out(fast, vni, f"10.0.9.{s.ip & 0xFF}")
                assert got is not None and IP(got).src == f"203.0.113.{s.eip & 0xFF}"
            for i in range(1, 4):
                if (vni, ip2int(f"10.0.9.{i}")) not in ref.static_in:  # no 1:1 EIP (any more): C makes a mapping
                    got = c_out(fast, vni, f"10.0.9.{i}", sport=6000 + i)
                    assert (got is not None) == (v is not None)
                    if got is not None:
                        assert IP(got).src == f"203.0.113.{v.snat[0].eips[0] & 0xFF}"
            for d in v.dnat if v else ():  # a DNAT target's replies are Python's
                assert c_out(fast, vni, f"10.0.1.{d.ip & 0xFF}", sport=80) is None
            for e in ref.served:  # a served EIP as destination is a hairpin: Python's
                assert c_out(fast, VNIS[0], "10.0.3.3", dst=f"203.0.113.{e & 0xFF}", sport=7000) is None
    finally:
        fast.close()


def section(v: int, ports: int, mac_byte: int = 1, vtep: str = "172.31.0.1", lb_port: int | None = None,
            role: str = "nat") -> GatewaySection:
    vid, eip = f"V{v}", f"203.0.{v // 250}.{v % 250 + 1}"
    eps = [Endpoint(port_id=f"p{v}.{i}", vpc_id=vid, vni=2000 + v, ip=f"10.0.0.{i + 2}",
                    mac=f"02:{mac_byte:02x}:{v >> 8:02x}:{v & 255:02x}:00:{i:02x}", host="hv1", vtep_ip=vtep)
           for i in range(ports)]
    lbs = [] if lb_port is None else [LbServed(id=f"lb{v}", vni=2000 + v, vip="10.0.0.100", listeners=[
        LbListenerServed(protocol="tcp", port=lb_port, idle_timeout_s=60, table_size=251,
                         members=[LbMemberServed(id=f"m{v}", ip="10.0.0.2", weight=1)])])]
    vpc = GatewayVpc(id=vid, vni=2000 + v, router_mac=f"0a:58:{mac_byte:02x}:00:{v >> 8:02x}:{v & 255:02x}",
                     snat=[SnatInfo(cidr="10.0.0.0/16", eips=[eip])] if role == "nat" else [])
    if role == "lb":
        return LbSection(vpc=vpc, endpoints=eps, lbs=lbs)
    return NatSection(vpc=vpc, endpoints=eps, eips=[eip])


def instance(tmp: Path, role: str) -> tuple[Instance, NativeDataPlane]:
    dp = NativeDataPlane("mem", "t", "ul0", "ext0", b"\x02" + bytes(5), b"\x02" + bytes(4) + b"\x01",
                         ip2int("198.18.0.1"))
    return Instance(lab_options(tmp, "198.18.0.1", ("02:00:00:00:00:00", "02:00:00:00:00:01")), role,
                    dataplane=dp), dp


def feed(g: Instance, held: GatewayHeld, rev: int, secs: list[GatewaySection], ids: set[str]) -> GatewayHeld:
    d = GatewayConfigDelta(name="t", revision=rev, base=rev - 1 if rev > 1 else -1, vpc_ids=sorted(ids),
                           sections=secs, vteps=[Vtep(host="hv1", ip="172.31.0.1")] if rev == 1 else None)
    out = apply_gateway_delta(held, d)
    assert out is not None
    g.apply_sections(*out)
    return out[0]


def c_endpoints(dp: NativeDataPlane, g: Instance) -> dict:
    ep_t, got = structure("tj_endpoint_t"), {}
    for (vni, ip) in g.fwd.endpoints:
        e = ep_t()
        if dp.lib.dp_get_endpoint(dp.h, vni, ip, ctypes.byref(e)):
            got[(vni, ip)] = (e.vtep, bytes(e.mac))
    return got


def test_one_tenants_write_crosses_only_that_tenants_records(tmp_path: Path) -> None:
    """1,000 VPCs held; then a write in one of them: one call into the data plane and none into the NAT table (its
    policy did not change), with that VPC's bytes alone; the others' sections are not looked at."""
    g, dp = instance(tmp_path, "nat")
    ids = {f"V{v}" for v in range(1, 1001)}
    held = feed(g, GatewayHeld(), 1, [section(v, 5) for v in range(1, 1001)], ids)
    assert dp.held() == {"vpcs": 1000, "endpoints": 5000}
    before_dp, before_nat = dict(dp.crossed), dict(g.role.table.crossed)
    held = feed(g, held, 2, [section(7, 6)], ids)  # a port added in V7
    ep_size = ctypes.sizeof(structure("tj_endpoint_t"))
    assert dp.crossed["calls"] - before_dp["calls"] == 1
    assert dp.crossed["bytes"] - before_dp["bytes"] == 6 + 6 * ep_size
    assert g.role.table.crossed == before_nat  # its NAT policy did not change: nothing crosses
    assert dp.held() == {"vpcs": 1000, "endpoints": 5001}
    assert c_endpoints(dp, g) == {k: (e.vtep_int, e.mac) for k, e in g.fwd.endpoints.items()}
    before_nat = dict(g.role.table.crossed)
    base = section(9, 5)  # V9's SNAT rule changes: its NAT record alone crosses
    changed = base.model_copy(update={"vpc": base.vpc.model_copy(update={
        "snat": [SnatInfo(cidr="10.0.0.0/24", eips=base.vpc.snat[0].eips)]})})
    feed(g, held, 3, [changed], ids)
    rec = ctypes.sizeof(structure("tj_nat_vpc_t")) + ctypes.sizeof(structure("tj_snat_rule_t")) + 4
    assert g.role.table.crossed["calls"] - before_nat["calls"] == 1
    assert g.role.table.crossed["bytes"] - before_nat["bytes"] == rec
    assert len(g.role.table.vpcs) == 1000 and g.role.table.lib.nat_vpc_count(g.role.table.h) == 1000
    dp.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(1, 3),
                                                                             st.sampled_from([None, 80, 443])))),
                min_size=1, max_size=10))
def test_what_c_holds_after_per_vpc_changes_is_what_python_holds(tmp_path_factory, seq: list) -> None:
    g, dp = instance(tmp_path_factory.mktemp("g"), "lb")
    held, ids, rev = GatewayHeld(), set(), 0
    try:
        for v, change in seq:
            rev += 1
            if change is None:
                ids.discard(f"V{v}")
                secs = []
            else:
                ids.add(f"V{v}")
                secs = [section(v, change[0], change[1], lb_port=change[2], role="lb")]
            held = feed(g, held, rev, secs, ids)
        assert dp.held() == {"vpcs": len(g.fwd.router_mac), "endpoints": len(g.fwd.endpoints)}
        assert c_endpoints(dp, g) == {k: (e.vtep_int, e.mac) for k, e in g.fwd.endpoints.items()}
        listeners = g.stage.policy.listeners
        for v in range(1, 5):
            for port in (80, 443):
                want = listeners.get((2000 + v, ip2int("10.0.0.100"), 6, port))
                got = dp.lib.dp_get_listener(dp.h, 2000 + v, ip2int("10.0.0.100"), 0, port)
                assert got == (0 if want is None else (want << 1) + 1)
    finally:
        dp.close()
