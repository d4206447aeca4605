"""The load balancer on the emulated cluster (`small`: two LB instances lb1, lb2): a VIP in front of backends on
three hypervisors, TCP and UDP, weights, isolation between tenants with identical addresses. The backends answer
with their name and the client address they saw (they see the client's own: nothing is set up inside them)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from tests.scenarios.conftest import wait_for
from tests.scenarios.lb_support import (
    connect_many,
    held,
    hold,
    make_lb,
    shares_within,
    start_backend,
    udp_ask,
    udp_flows,
    wait_serving,
)

HOSTS = ("hv1", "hv2", "hv3")


def web_tier(tenants, cidr: str = "10.40.0.0/16"):
    n = tenants()
    n.vpc("prod", cidr, {"web": cidr.replace("0.0/16", "1.0/24"), "app": cidr.replace("0.0/16", "2.0/24")})
    backends = [n.vm("web", h) for h in HOSTS]
    clients = [n.vm("app", "hv1"), n.vm("app", "hv2")]
    return n, backends, clients


def test_lb_1_tcp_shares_weights_and_client_addresses(cluster, tenants) -> None:
    n, backends, clients = web_tier(tenants)
    lb = make_lb(n, "prod", "web", backends)
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        names = [b["name"] for b in backends]
        got, seen = {}, {}
        for c in clients:  # 3,000 connections from two client VMs
            g, by_backend, fails = connect_many(n, c, lb.vip, 1500)
            assert fails == 0, f"{fails} of 1,500 connections failed from {c['name']}"
            got = {k: got.get(k, 0) + v for k, v in g.items()} if got else dict(g)
            for b, addrs in by_backend.items():
                seen.setdefault(b, set()).update(addrs)
        total = Counter(got)
        print(f"lb_1: equal weights {sorted(total.values())}")
        assert shares_within(total, {b: 1 / 3 for b in names}), f"equal weights, shares {total}"
        assert seen == {b: {c["ip"] for c in clients} for b in names}, \
            f"each backend's log should show both clients' own addresses: {seen}"
        for (b, w) in zip(names, (1, 2, 3), strict=True):
            n.client.patch(f"/v1/pools/{lb.pool['id']}/members/{lb.members[b]['id']}", {"weight": w})
        wait_serving(n, clients[0], lb.vip, 3)
        weighted = Counter()
        for c in clients:
            g, _, fails = connect_many(n, c, lb.vip, 1500)
            assert fails == 0
            weighted.update(g)
        print(f"lb_1: weights 1:2:3 {[weighted[b] for b in names]}")
        assert shares_within(weighted, {names[0]: 1 / 6, names[1]: 2 / 6, names[2]: 3 / 6}), \
            f"weights 1:2:3, shares {weighted}"
        statuses = [cluster.gateway_status(g) for g in ("lb1", "lb2")]
        assert all(st["fastpath"].split()[0] in ("xdp", "dpdk") for st in statuses), "not on the native path"
        in_c = [st["dataplane"].get("lb_to_member", 0) for st in statuses]
        assert all(n > 0 for n in in_c), f"both instances carried connections, in C: {in_c}"
    finally:
        lb.stop()


def test_lb_2_udp_replies_come_from_the_vip(cluster, tenants) -> None:
    n, backends, clients = web_tier(tenants, "10.41.0.0/16")
    lb = make_lb(n, "prod", "web", backends)
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        answers = [udp_ask(n, clients[1], lb.vip) for _ in range(10)]
        assert all(a is not None for a in answers), answers
        assert {a[0] for a in answers} == {f"{lb.vip}:53"}, f"replies came from {answers}"
        assert all(a[1].split()[1].startswith(clients[1]["ip"] + ":") for a in answers), answers
    finally:
        lb.stop()


def test_lb_9_isolation_identical_vips_and_backends(cluster, tenants) -> None:
    """Two tenants, the same VPC CIDR, the same VIP address, the same backend addresses: each reaches its own."""
    nets = []
    for _ in range(2):
        n = tenants()
        n.vpc("prod", "10.42.0.0/16", {"web": "10.42.1.0/24", "app": "10.42.2.0/24"})
        backends = [n.vm("web", h, ip=f"10.42.1.{10 + i}") for i, h in enumerate(HOSTS[:2])]
        client = n.vm("app", "hv3", ip="10.42.2.10")
        nets.append((n, backends, client, make_lb(n, "prod", "web", backends, vip="10.42.1.100")))
    try:
        for n, backends, client, lb in nets:
            wait_serving(n, client, lb.vip, 2)
            got, _, fails = connect_many(n, client, lb.vip, 200)
            assert fails == 0 and set(got) == {b["name"] for b in backends}, \
                f"a tenant's client reached {set(got)}, its backends are {[b['name'] for b in backends]}"
    finally:
        for *_, lb in nets:
            lb.stop()


def test_lb_4_add_member_under_load(cluster, tenants) -> None:
    """Established connections keep their member; of fresh flows, the share that moves is near Maglev's minimum
    (1/4 when a fourth member joins three): at most 1.5x it."""
    n, backends, clients = web_tier(tenants, "10.43.0.0/16")
    extra = n.vm("web", "hv1")
    lb = make_lb(n, "prod", "web", backends, udp_idle=1)
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        long = hold(clients[1], lb.vip, 12, 8)
        before = udp_flows(n, clients[0], lb.vip, range(20000, 20600))
        n.client.post(f"/v1/pools/{lb.pool['id']}/members", {"port_id": extra["port_id"], "protocol_port": 8080})
        n.client.post(f"/v1/pools/{lb.upool['id']}/members", {"port_id": extra["port_id"], "protocol_port": 5353})
        lb.procs.append(start_backend(extra))
        wait_serving(n, clients[0], lb.vip, 4)
        time.sleep(2.5)  # the first round's UDP entries idle out (1 s): the second round is decided afresh
        after = udp_flows(n, clients[0], lb.vip, range(20000, 20600))
        moved = sum(1 for s in before if s in after and after[s] != before[s]) / len(before)
        to_new = sum(1 for s in after if after[s] == extra["name"]) / len(after)
        print(f"lb_4: the new member took {to_new:.1%} of fresh flows, {moved:.1%} moved (minimum 25%)")
        assert 0.18 <= to_new <= 0.32, f"the new member took {to_new:.0%} of fresh flows"
        assert moved <= 1.5 * 0.25, f"{moved:.0%} of flows moved; Maglev's minimum is 25%"
        conns = held(long)
        assert len(conns) == 12 and all("ERR" not in {w for _, w in c} and len({w for _, w in c}) == 1
                                        for c in conns.values()), f"established connections broke: {conns}"
    finally:
        lb.stop()


def test_lb_5_drain(cluster, tenants) -> None:
    """Weight 0: the member's established connections go on, it gets no new ones, and they end after the pool's
    deregistration delay (4 s here)."""
    n, backends, clients = web_tier(tenants, "10.44.0.0/16")
    lb = make_lb(n, "prod", "web", backends, delay=4)
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        long = hold(clients[1], lb.vip, 24, 12)
        time.sleep(1.5)
        victim = backends[0]["name"]
        n.client.patch(f"/v1/pools/{lb.pool['id']}/members/{lb.members[victim]['id']}", {"weight": 0})
        drained_at = time.monotonic()
        cluster.wait_converged()
        got, _, fails = connect_many(n, clients[0], lb.vip, 300)
        assert fails == 0 and victim not in got, f"new connections reached the draining member: {got}"
        member = n.client.get(f"/v1/pools/{lb.pool['id']}/members")
        assert {x["id"]: x["operating_status"] for x in member}[lb.members[victim]["id"]] == "DRAINING"
        conns = held(long)
        on_victim = {i: c for i, c in conns.items() if c[0][1] == victim}
        assert on_victim, "no long-lived connection was on the drained member"
        t_drain = drained_at - (time.monotonic() - 12)  # the drain's time on the clients' clock, roughly
        for c in on_victim.values():
            kept = [t for t, w in c if w == victim]
            assert max(kept) >= t_drain + 2, f"a drained member's connection stopped early: {c}"
            assert c[-1][1] == "ERR" and c[-1][0] <= t_drain + 4 + 5, f"it outlived the delay: {c}"
        others = [c for i, c in conns.items() if i not in on_victim]
        assert all(c[-1][1] != "ERR" for c in others), "connections to other members broke"
    finally:
        lb.stop()


def test_lb_6_kill_one_instance(cluster, tenants) -> None:
    """New connections work within 3 s; long-lived connections hashed to the dead instance go on through the
    survivor, which holds the same table (all of them here: the members did not change)."""
    n, backends, clients = web_tier(tenants, "10.45.0.0/16")
    lb = make_lb(n, "prod", "web", backends)
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        long = hold(clients[1], lb.vip, 24, 10)
        time.sleep(2)
        cluster.kill_gateway("lb1")
        t0 = time.monotonic()
        wait_for(lambda: connect_many(n, clients[0], lb.vip, 20, workers=20)[2] == 0, 3,
                 "new connections after an instance died")
        recovered = time.monotonic() - t0
        conns = held(long)
        broken = [i for i, c in conns.items() if c[-1][1] == "ERR"]
        print(f"lb_6: new connections after {recovered:.2f} s; {len(conns) - len(broken)} of {len(conns)} "
              "long-lived connections went on")
        assert not broken, f"{len(broken)} of 24 long-lived connections broke (new ones after {recovered:.1f} s)"
    finally:
        lb.stop()
        cluster.start_gateway("lb1")
        cluster.wait_gateways(timeout=30)


def test_lb_7_from_a_peered_vpc_and_the_internet(cluster, tenants, internet) -> None:
    n, backends, _ = web_tier(tenants, "10.46.0.0/16")
    other = n.vpc("other", "10.47.0.0/16", {"o": "10.47.1.0/24"})
    n.client.post("/v1/peerings", {"requester_vpc_id": n.vpcs["prod"]["id"], "accepter_vpc_id": other["id"]})
    peer_client = n.vm("o", "hv3")
    eip = n.client.post("/v1/eips", {})
    lb = make_lb(n, "prod", "web", backends, eip_id=eip["id"])
    try:
        wait_serving(n, peer_client, lb.vip, 3)
        got, seen, fails = connect_many(n, peer_client, lb.vip, 300)
        assert fails == 0 and len(got) == 3 and all(a == {peer_client["ip"]} for a in seen.values()), seen
        wait_for(lambda: connect_many(n, None, eip["address"], 10, ns=internet["ns"])[2] == 0, 15,
                 "the VIP's EIP answering the internet")
        got, seen, fails = connect_many(n, None, eip["address"], 300, ns=internet["ns"])
        assert fails == 0 and len(got) == 3, f"from the internet: {got}, {fails} failed"
        assert all(addrs == {internet["ip"]} for addrs in seen.values()), \
            f"the backends saw {seen}, not the internet client's address"
    finally:
        lb.stop()


def member_status(n, lb) -> dict[str, str]:
    by_id = {m["id"]: name for name, m in lb.members.items()}
    return {by_id[x["id"]]: x["operating_status"] for x in n.client.get(f"/v1/pools/{lb.pool['id']}/members")}


def test_lb_3_health_checks(cluster, tenants) -> None:
    """HTTP checks from the members' own vSwitches (interval 1 s, timeout 0.5 s, rise 2, fall 2): a stopped server
    gets no new connection after interval x fall + 1 s = 3 s, is back after it answers `rise` checks; with every
    member down the pool is OFFLINE and fails open (the instances keep sending to all)."""
    n, backends, clients = web_tier(tenants, "10.48.0.0/16")
    lb = make_lb(n, "prod", "web", backends)
    try:
        n.client.put(f"/v1/pools/{lb.pool['id']}/health-monitor", {"type": "http", "interval_s": 1, "timeout_s": 0.5,
                                                                   "rise": 2, "fall": 2, "url_path": "/healthz",
                                                                   "expected_codes": "200-299"})
        names = [b["name"] for b in backends]
        wait_for(lambda: set(member_status(n, lb).values()) == {"ONLINE"}, 15, "every member ONLINE")
        wait_serving(n, clients[0], lb.vip, 3)
        victim = names[0]
        lb.procs[0].kill()
        stopped = time.monotonic()
        time.sleep(max(0.0, stopped + 3 - time.monotonic()))
        got, _, _ = connect_many(n, clients[0], lb.vip, 200)
        assert victim not in got and member_status(n, lb)[victim] == "OFFLINE", \
            f"3 s after its server stopped the member still gets connections: {got}"
        lb.procs[0] = start_backend(backends[0])
        back = wait_for(lambda: member_status(n, lb)[victim] == "ONLINE", 10, "the member ONLINE again")
        wait_for(lambda: victim in connect_many(n, clients[0], lb.vip, 60)[0], 3, "connections reaching it again")
        print(f"lb_3: back ONLINE {back:.1f} s after its server started (rise 2 x interval 1 s)")
        before = Counter(cluster.gateway_status(g)["lb"].get("drop_no_member", 0) for g in ("lb1", "lb2"))
        for p in lb.procs:
            p.kill()
        wait_for(lambda: n.client.get(f"/v1/pools/{lb.pool['id']}")["operating_status"] == "OFFLINE", 10,
                 "the pool OFFLINE")
        lb.procs[1] = start_backend(backends[1])  # one server answers again, its checks not yet passed
        got, _, _ = connect_many(n, clients[0], lb.vip, 60, workers=8)
        assert got.get(names[1], 0) > 0, "with every member down the pool did not fail open"
        after = Counter(cluster.gateway_status(g)["lb"].get("drop_no_member", 0) for g in ("lb1", "lb2"))
        assert after == before, "an instance dropped connections for want of a member"
    finally:
        lb.stop()


def test_lb_8_syn_flood(cluster, tenants, internet) -> None:
    """Spoofed SYNs from the internet at the VIP's EIP, more than twice what the instance remembers (5,000 new
    connections/s on the emulated cluster): established connections, from inside and from the internet, go on; the
    connection table stays bounded (Maglev alone decides the excess: `fallback`); the counters move. (A flood
    above what the wire carries drops packets of every connection alike, before any table sees them.)"""
    import json
    import subprocess

    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    from bench.lb_wire import generator

    n, backends, clients = web_tier(tenants, "10.49.0.0/16")
    eip = n.client.post("/v1/eips", {})
    lb = make_lb(n, "prod", "web", backends, eip_id=eip["id"])
    ins = internet["ns"]
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        wait_for(lambda: connect_many(n, None, eip["address"], 10, ns=ins)[2] == 0, 15, "the EIP answering")
        home = next(g for g in ("lb1", "lb2") if eip["address"] in cluster.gateway_status(g)["eips"])
        before = cluster.gateway_status(home)["lb"]
        inside, outside = hold(clients[1], lb.vip, 12, 9), hold({"ns": ins}, eip["address"], 6, 9)
        time.sleep(2)
        neigh = json.loads(subprocess.run(["ip", "-n", ins, "-j", "neigh", "show", eip["address"]],
                                          capture_output=True, text=True).stdout)[0]["lladdr"]
        mine = json.loads(subprocess.run(["ip", "-n", ins, "-j", "link", "show", "eth0"], capture_output=True,
                                         text=True).stdout)[0]["address"]
        frame = Path(f"/tmp/tianji-synflood-{eip['id'][:8]}.bin")
        frame.write_bytes(bytes(Ether(src=mine, dst=neigh) / IP(src="198.51.100.50", dst=eip["address"])
                                / TCP(sport=1024, dport=80, flags="S")))
        try:
            # 12,000 SYNs/s: 2.4 times what the table takes, within what the instance carries here while the
            # whole suite's cluster runs (20,000/s was beyond it on a slow day: a quarter of the flood never
            # reached the table, and established connections lost packets with it)
            r = subprocess.run(["ip", "netns", "exec", ins, str(generator()), "eth0", "3", str(frame), "14", "new",
                                "1", "12000"], capture_output=True, text=True, timeout=30)
        finally:
            frame.unlink(missing_ok=True)
        sent = int(r.stdout.split()[0])
        conns = held(inside) | {100 + i: c for i, c in held(outside).items()}
        broken = [i for i, c in conns.items() if c[-1][1] == "ERR"]
        st = cluster.gateway_status(home)
        after = st["lb"]
        print(f"lb_8: {sent:,} spoofed SYNs in 3 s; remembered {after.get('new', 0) - before.get('new', 0):,}, "
              f"by Maglev alone {after.get('fallback', 0) - before.get('fallback', 0):,}; table holds "
              f"{st['connections']:,}; {len(conns) - len(broken)} of {len(conns)} established connections went on")
        assert not broken, f"established connections broke under the flood: {broken}"
        assert after.get("fallback", 0) - before.get("fallback", 0) > 0, "the flood was not limited"
        assert st["connections"] <= 500 + 5000 * 5 < sent, f"the table grew to {st['connections']}"
    finally:
        lb.stop()
