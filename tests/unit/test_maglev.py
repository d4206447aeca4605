"""Maglev tables: C and Python identical; deterministic in the members whatever their order; balanced, weighted,
drained members out; minimal disruption when members leave."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfv_gateways.roles.lb.maglev import DEFAULT_M, build, flow_hash, member_key
from nfv_gateways.roles.lb.native import NativeMaglev

C = NativeMaglev()


def keys(n: int) -> list[int]:
    return [member_key(f"member-{i}") for i in range(n)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 5)), min_size=0, max_size=12),
       st.sampled_from([251, 1021, 4099]))
def test_c_builds_the_python_table(members, m) -> None:
    ks, ws = [k for k, _ in members], [w for _, w in members]
    assert C.build(ks, ws, m) == build(ks, ws, m)


def test_the_table_depends_on_the_members_not_their_order() -> None:
    ks, ws = keys(20), [1 + i % 3 for i in range(20)]
    order = list(range(20))
    random.Random(7).shuffle(order)
    a = [ks[i] if i >= 0 else None for i in C.build(ks, ws)]
    b = [[ks[j] for j in order][i] if i >= 0 else None for i in C.build([ks[j] for j in order],
                                                                         [ws[j] for j in order])]
    assert a == b


def test_shares_are_even_or_weighted_and_drained_members_get_none() -> None:
    for n in (3, 10, 100):
        share = Counter(C.build(keys(n), [1] * n))
        assert len(share) == n and max(share.values()) / min(share.values()) < 1.05, n
    share = Counter(C.build(keys(3), [1, 2, 3]))
    total = sum(share.values())
    assert all(abs(share[i] / total - (i + 1) / 6) < 0.01 for i in range(3)), share
    share = Counter(C.build(keys(4), [1, 0, 1, 1]))
    assert 1 not in share and len(share) == 3
    assert set(C.build(keys(3), [0, 0, 0], 251)) == {-1}
    with pytest.raises(ValueError, match="prime"):
        C.build(keys(3), [1, 1, 1], 65536)
    with pytest.raises(ValueError, match="prime"):
        build(keys(3), [1, 1, 1], 65536)


def test_a_member_leaving_moves_little_more_than_its_own_entries() -> None:
    n = 100
    ks = keys(n)
    before = [ks[i] for i in C.build(ks, [1] * n)]
    after = [ks[i] for i in C.build(ks, [1] * (n - 1) + [0])]
    changed = sum(a != b for a, b in zip(before, after, strict=True)) / DEFAULT_M
    own = before.count(ks[-1]) / DEFAULT_M
    assert own <= changed < own * 3, (own, changed)  # the paper's minimal disruption, within a small factor


def test_flow_hash_is_the_same_in_c_and_python() -> None:
    rnd = random.Random(1)
    for _ in range(200):
        t = (rnd.getrandbits(32), rnd.getrandbits(32), rnd.getrandbits(16), rnd.getrandbits(16), rnd.choice([6, 17]))
        assert C.flow_hash(*t) == flow_hash(*t)
