"""The load balancer on the emulated cluster (`small`: two LB instances lb1, lb2): a VIP in front of backends on
three hypervisors, TCP and UDP, weights, isolation between tenants with identical addresses. The backends answer
with their name and the client address they saw (they see the client's own: nothing is set up inside them)."""

from __future__ import annotations

from tests.scenarios.lb_support import connect_many, make_lb, shares_within, udp_ask, wait_serving

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
        got, seen = {}, set()
        for c in clients:  # 3,000 connections from two client VMs
            g, addrs, fails = connect_many(n, c, lb.vip, 1500)
            assert fails == 0, f"{fails} of 1,500 connections failed from {c['name']}"
            got = {k: got.get(k, 0) + v for k, v in g.items()} if got else dict(g)
            seen |= addrs
        from collections import Counter

        total = Counter(got)
        assert shares_within(total, {b: 1 / 3 for b in names}), f"equal weights, shares {total}"
        assert seen == {c["ip"] for c in clients}, f"backends saw {seen}, not the clients' own addresses"
        for (b, w) in zip(names, (1, 2, 3), strict=True):
            n.client.patch(f"/v1/pools/{lb.pool['id']}/members/{lb.members[b]['id']}", {"weight": w})
        wait_serving(n, clients[0], lb.vip, 3)
        weighted = Counter()
        for c in clients:
            g, _, fails = connect_many(n, c, lb.vip, 1500)
            assert fails == 0
            weighted.update(g)
        assert shares_within(weighted, {names[0]: 1 / 6, names[1]: 2 / 6, names[2]: 3 / 6}), \
            f"weights 1:2:3, shares {weighted}"
        statuses = [cluster.gateway_status(g) for g in ("lb1", "lb2")]
        assert all(st["lb"].get("to_member", 0) > 0 for st in statuses), "both instances carried connections"
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
