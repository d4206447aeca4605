"""The incremental flow engine equals the from-scratch computation after every change, and its diffs, applied
in order, leave exactly the desired flows installed (hypothesis over random change sequences)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tianji.southbound import (
    Endpoint,
    HostConfig,
    PortInfo,
    RouteInfo,
    SecurityGroupInfo,
    SecurityGroupRuleInfo,
    SubnetInfo,
    VpcInfo,
    Vtep,
)
from vswitch_agent.engine import FlowEngine
from vswitch_agent.flow import object_hash
from vswitch_agent.flows import compute_flows

VPCS = {"A": 1001, "B": 1002, "C": 1003}
CIDR = {"A": "10.1.0.0/16", "B": "10.2.0.0/16", "C": "10.1.0.0/16"}  # C overlaps A: another tenant
PORTS = [f"p{i}" for i in range(8)]
TUN = 50


def world(state: dict) -> tuple[HostConfig, dict[str, int], dict[str, int]]:
    """A host config for hv1 from a drawn state: each port's VPC, host, groups' rules and plugging."""
    eps, ports = [], []
    for i, pid in enumerate(PORTS):
        vpc, host = state["placement"][i]
        if vpc is None:
            continue
        ip = CIDR[vpc].replace("0.0/16", f"0.{10 + i}")
        mac = f"02:00:00:00:00:{i:02x}"
        eps.append(Endpoint(port_id=pid, vpc_id=vpc, vni=VPCS[vpc], ip=ip, mac=mac, host=host,
                            vtep_ip="192.0.2.1" if host == "hv1" else "192.0.2.2"))
        if host == "hv1":
            ports.append(PortInfo(id=pid, vpc_id=vpc, subnet_id=f"s{vpc}", mac=mac, ip=ip,
                                  security_group_ids=[f"sg{vpc}"] + (["web"] if vpc == "A" and i % 2 else []),
                                  eip_home_vtep="198.18.0.1" if i == state["eip"] else None))
    local = {p.vpc_id for p in ports}
    peered = state["peered"]
    wanted = set(local) | ({"A", "B"} & local and {"A", "B"} if peered else set())
    vpcs = []
    for v in sorted(wanted):
        routes = [RouteInfo(destination=CIDR[v], target_type="local")]
        other = {"A": "B", "B": "A"}.get(v)
        if peered and other:
            routes.append(RouteInfo(destination=CIDR[other], target_type="peering", peer_vpc_id=other))
        if v == "A" and state["nat"]:
            routes.append(RouteInfo(destination="0.0.0.0/0", target_type="nat-gateway", gateway_vteps=state["nat"],
                                    gateway_buckets=(state["nat"] * 8)[:8]))
        vpcs.append(VpcInfo(id=v, tenant_id=f"t{v}", vni=VPCS[v], cidr=CIDR[v],
                            router_mac=f"0a:58:00:00:00:0{VPCS[v] % 10}",
                            subnets=[SubnetInfo(id=f"s{v}", cidr=CIDR[v].replace("/16", "/24"),
                                                gateway_ip=CIDR[v].replace("0.0/16", "0.1"))], routes=routes))
    eps = [e for e in eps if e.vpc_id in wanted]
    groups = []
    for v in sorted(local):
        members = [f"{e.ip}/32" for e in eps if e.vpc_id == v]
        rules = [SecurityGroupRuleInfo(id=VPCS[v] * 10 + 1, direction="egress", protocol="any",
                                       remote_cidrs=["0.0.0.0/0"]),
                 SecurityGroupRuleInfo(id=VPCS[v] * 10 + 2, direction="ingress", protocol="any", remote_cidrs=members)]
        if state["ssh"]:
            rules.append(SecurityGroupRuleInfo(id=VPCS[v] * 10 + 3, direction="ingress", protocol="tcp",
                                               port_range_min=22, port_range_max=23, remote_cidrs=["0.0.0.0/0"]))
        groups.append(SecurityGroupInfo(id=f"sg{v}", vpc_id=v, rules=rules))
    if any("web" in p.security_group_ids for p in ports):
        groups.append(SecurityGroupInfo(id="web", vpc_id="A", rules=[SecurityGroupRuleInfo(
            id=9, direction="ingress", protocol="tcp", port_range_min=80, port_range_max=80,
            remote_cidrs=["0.0.0.0/0"] + (["10.2.0.0/16"] if state["ssh"] else []))]))
    vteps = [Vtep(host="hv1", ip="192.0.2.1"), Vtep(host="hv2", ip="192.0.2.2")][: 1 + state["vteps"]]
    cfg = HostConfig(host="hv1", revision=0, vtep_ip="192.0.2.1", ports=ports, vpcs=vpcs, endpoints=eps,
                     security_groups=groups, vteps=vteps)
    ofports = {p.id: 1 + PORTS.index(p.id) for i, p in enumerate(ports) if state["plugged"][PORTS.index(p.id)]}
    zones = {v: VPCS[v] % 100 for v in local}
    return cfg, ofports, zones


def sections(cfg: HostConfig, ofports: dict[str, int]) -> dict[str, tuple]:
    """What the controller's delta and the agent's plug events name: per VPC, everything of it."""
    out = {}
    for v in cfg.vpcs:
        out[v.id] = (v, [e for e in cfg.endpoints if e.vpc_id == v.id], [p for p in cfg.ports if p.vpc_id == v.id],
                     [g for g in cfg.security_groups if g.vpc_id == v.id],
                     sorted((p.id, ofports.get(p.id)) for p in cfg.ports if p.vpc_id == v.id))
    return out


states = st.fixed_dictionaries({
    "placement": st.lists(st.tuples(st.sampled_from([None, "A", "B", "C"]), st.sampled_from(["hv1", "hv2"])),
                          min_size=len(PORTS), max_size=len(PORTS)),
    "plugged": st.lists(st.booleans(), min_size=len(PORTS), max_size=len(PORTS)),
    "peered": st.booleans(), "ssh": st.booleans(), "vteps": st.integers(0, 1),
    "eip": st.integers(-1, len(PORTS) - 1), "nat": st.sampled_from([[], ["198.18.0.5"], ["198.18.0.5", "198.18.0.6"]]),
    "tunnel": st.sampled_from([TUN, TUN, TUN, None]),
})


@settings(max_examples=150, deadline=None)
@given(st.lists(states, min_size=1, max_size=8), st.lists(st.booleans(), min_size=8, max_size=8))
def test_incremental_equals_from_scratch(steps: list[dict], whole: list[bool]) -> None:
    engine = FlowEngine()
    installed: dict[int, object] = {}
    prev: dict[str, tuple] = {}
    for state, send_whole in zip(steps, whole, strict=False):
        cfg, ofports, zones = world(state)
        now = sections(cfg, ofports)
        changed = None if send_whole else {v for v in set(now) | set(prev) if now.get(v) != prev.get(v)}
        diff = engine.update(cfg, ofports, state["tunnel"], zones, changed)
        for f in diff.add:  # the agent's order: adds, then deletes
            installed[f.cookie] = f
        for f in diff.delete:
            installed.pop(f.cookie, None)
        want = {f.cookie: f for f in compute_flows(cfg, ofports, state["tunnel"], zones)}
        assert engine.desired == want
        assert installed == want
        assert not {f.cookie for f in diff.add} & {f.cookie for f in diff.delete}
        prev = now


def test_a_change_in_one_vpc_touches_only_its_flows() -> None:
    state = {"placement": [("A", "hv1"), ("A", "hv2"), ("B", "hv1"), ("C", "hv1"), (None, "hv1"), ("C", "hv2"),
                           (None, "hv1"), (None, "hv1")],
             "plugged": [True] * 8, "peered": False, "ssh": False, "vteps": 1, "eip": -1, "nat": [], "tunnel": TUN}
    engine = FlowEngine()
    cfg, of, zones = world(state)
    engine.update(cfg, of, TUN, zones, None)
    state["placement"][4] = ("C", "hv2")  # a remote port appears in C
    cfg, of, zones = world(state)
    diff = engine.update(cfg, of, TUN, zones, {"C"})
    touched = {object_hash(o) for o in ("p4", "C:p4", str(1003 * 10 + 2))}
    assert diff.add and all(f.obj_hash in touched or f.conjunctive for f in diff.add), diff.add
    assert engine.desired == {f.cookie: f for f in compute_flows(cfg, of, TUN, zones)}
    assert engine.update(cfg, of, TUN, zones, set()).add == []
