"""The load balancer's connection table: C against the Python reference, and what it must guarantee."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nfv_gateways.roles.lb.maglev import build, member_key
from nfv_gateways.roles.lb.native import NativeLb
from nfv_gateways.roles.lb.reference import LbTable

M = 251


def pool_of(members: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(Maglev table, member ids) for members given as (id, weight)."""
    return build([member_key(str(i)) for i, _ in members], [w for _, w in members], M), [i for i, _ in members]


ops = st.one_of(
    st.tuples(st.just("pool"), st.integers(0, 2), st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3)),
                                                            max_size=5, unique_by=lambda x: x[0])),
    st.tuples(st.just("pick"), st.integers(0, 2), st.tuples(st.integers(1, 3), st.integers(1, 40),
                                                            st.integers(1000, 1003), st.sampled_from([6, 17]))),
    st.tuples(st.just("tick"), st.floats(0, 4, allow_nan=False)),
    st.tuples(st.just("expire")),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ops, max_size=60))
def test_c_decides_as_the_reference(seq) -> None:
    ref, c = LbTable(capacity=16, new_per_s=2.0, burst=4), NativeLb(capacity=16, new_per_s=2.0, burst=4)
    now = 0.0
    try:
        for op in seq:
            if op[0] == "pool":
                table, ids = pool_of(op[2])
                for t in (ref, c):
                    t.set_pool(op[1], table, ids, idle=3.0)
            elif op[0] == "pick":
                vni, src, sport, proto = op[2]
                args = (op[1], vni, 0x0A000000 + src, 0x0A0000FE, sport, 80, proto, now)
                assert ref.pick(*args) == c.pick(*args), op
            elif op[0] == "tick":
                now += op[1]
            else:
                assert ref.expire(now) == c.expire(now)
            assert +ref.counters == c.counters and len(ref.conns) == c.held()
    finally:
        c.close()


def test_connections_keep_their_member_when_members_change_and_drained_ones_go_on() -> None:
    for t in (LbTable(), NativeLb()):
        table, ids = pool_of([(1, 1), (2, 1), (3, 1)])
        t.set_pool(0, table, ids, idle=60)
        flows = [(0, 7, 0x0A000000 + i, 0x0A0000FE, 40000 + i, 80, 6) for i in range(300)]
        first = {f: t.pick(*f, 1.0) for f in flows}
        assert set(first.values()) == {1, 2, 3}
        table, ids = pool_of([(1, 1), (2, 0), (3, 1), (4, 1)])  # 2 drains, 4 joins
        t.set_pool(0, table, ids, idle=60)
        assert all(t.pick(*f, 2.0) == first[f] for f in flows)  # established: same member, 2's included
        new = [t.pick(0, 7, 0x0B000000 + i, 0x0A0000FE, 50000 + i, 80, 6, 2.0) for i in range(300)]
        assert 2 not in new and 4 in new  # new connections: never the draining member
        table, ids = pool_of([(1, 1), (3, 1), (4, 1)])  # 2 removed: its connections are decided afresh
        t.set_pool(0, table, ids, idle=60)
        assert all(t.pick(*f, 3.0) in (1, 3, 4) for f in flows)
        assert t.pick(9, 7, 1, 2, 3, 4, 6, 3.0) == -1  # no such pool


def test_a_flood_of_new_connections_cannot_evict_the_established() -> None:
    t = NativeLb(capacity=1024, new_per_s=1000.0, burst=100)
    table, ids = pool_of([(1, 1), (2, 1), (3, 1)])
    t.set_pool(0, table, ids, idle=60)
    est = {(0, 7, 0x0A000000 + i, 0x0A0000FE, 40000 + i, 80, 6): None for i in range(50)}
    for f in est:
        est[f] = t.pick(*f, 0.0)
    for i in range(20000):  # spoofed SYNs within one second: far above the rate
        t.pick(0, 7, 0xC0000000 + i, 0x0A0000FE, i % 65536, 80, 6, 0.5)
    assert t.held() <= 1024 // 4 * 3 and t.counters["fallback"] > 19000
    table, ids = pool_of([(1, 1), (2, 1), (3, 1), (4, 1)])
    t.set_pool(0, table, ids, idle=60)
    assert all(t.pick(*f, 0.6) == m for f, m in est.items())  # still remembered: members kept
