"""Property tests of IP address management."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from controller.api.ipam import IpamError, check_fixed_ip, next_free, parse_cidr, random_mac, usable_range

nets = st.builds(lambda addr, plen: ipaddress.IPv4Network((addr, plen), strict=False),
                 st.integers(0, 2**32 - 1), st.integers(20, 28))


@given(nets, st.data())
def test_allocation_never_returns_reserved_or_duplicate(net: ipaddress.IPv4Network, data: st.DataObject) -> None:
    lo, hi = usable_range(net)
    used: set[int] = set(data.draw(st.sets(st.integers(lo, hi), max_size=20)))
    for _ in range(data.draw(st.integers(1, 30))):
        highest = max(used) if used else None
        try:
            ip = next_free(net, lambda: used, highest)
        except IpamError:
            assert len(used) == hi - lo + 1
            break
        assert ip in net
        assert ip not in (net.network_address, net.network_address + 1, net.broadcast_address)
        assert int(ip) not in used
        used.add(int(ip))


@given(nets)
def test_small_subnet_exhausts_exactly(net: ipaddress.IPv4Network) -> None:
    used: set[int] = set()
    lo, hi = usable_range(net)
    for _ in range(hi - lo + 1):
        used.add(int(next_free(net, lambda: used, max(used) if used else None)))
    assert len(used) == net.num_addresses - 3
    try:
        next_free(net, lambda: used, max(used))
        raise AssertionError("allocation past exhaustion")
    except IpamError as e:
        assert "no free addresses" in str(e)


@given(nets, st.integers(0, 2**32 - 1))
def test_fixed_ip_validation(net: ipaddress.IPv4Network, raw: int) -> None:
    ip = ipaddress.IPv4Address(raw)
    lo, hi = usable_range(net)
    try:
        check_fixed_ip(net, str(ip))
        assert lo <= raw <= hi
    except IpamError:
        assert not lo <= raw <= hi


@given(st.integers(0, 2**32 - 1), st.integers(0, 32))
def test_parse_cidr_prefix_bounds(addr: int, plen: int) -> None:
    net = ipaddress.IPv4Network((addr, plen), strict=False)
    try:
        parse_cidr(str(net))
        assert 8 <= plen <= 28
    except IpamError:
        assert not 8 <= plen <= 28


def test_random_mac_is_local_unicast() -> None:
    for _ in range(1000):
        first = int(random_mac().split(":")[0], 16)
        assert first & 0x02 and not first & 0x01


def test_next_vni_moves_forward_wraps_and_skips_taken_and_quarantined() -> None:
    import pytest

    from controller.api.ipam import IpamError, next_vni

    def taken_of(used: set[int], held: set[int]):
        return lambda a, b: ({v for v in used if a <= v <= b}, {v for v in held if a <= v <= b})

    assert next_vni(0, 10, 20, taken_of(set(), set())) == 10
    assert next_vni(12, 10, 20, taken_of({13}, {14})) == 15  # forward: 13 in use, 14 freed recently
    assert next_vni(20, 10, 20, taken_of({10}, set())) == 11  # wraps at the top
    assert next_vni(15, 10, 20, taken_of(set(), set())) == 16  # a freed 11 is not reused before the wrap
    with pytest.raises(IpamError, match="2 freed"):
        next_vni(12, 10, 13, taken_of({10, 13}, {11, 12}))
