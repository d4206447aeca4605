"""IPv6 address management: /56s from pools and /64s from a /56 handed out lowest first, never twice; EUI-64 as
RFC 4291 forms it; ports' addresses never the router's nor outside the subnet."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.api.ipam6 import (
    Ipam6Error,
    check_fixed_ip6,
    eui64,
    link_local,
    next_free6,
    next_subnet_cidr6,
    next_vpc_cidr6,
    parse_cidr6,
    space_error6,
)

POOL = ipaddress.IPv6Network("fd00:7469::/48")


@given(st.sets(st.integers(0, 255), max_size=60))
def test_the_lowest_free_56_of_the_pool_is_handed_out(taken: set[int]) -> None:
    blocks = list(POOL.subnets(new_prefix=56))
    used = [str(blocks[i]) for i in taken]
    if len(taken) == 256:
        with pytest.raises(Ipam6Error):
            next_vpc_cidr6([POOL], used)
        return
    got = next_vpc_cidr6([POOL], used)
    assert got == blocks[min(set(range(256)) - taken)]


def test_pools_are_taken_in_order_and_a_full_one_says_what_to_do() -> None:
    small = ipaddress.IPv6Network("fd00:1::/56")
    assert next_vpc_cidr6([small, POOL], [str(small)]) == next(POOL.subnets(new_prefix=56))
    with pytest.raises(Ipam6Error, match="TIANJI_IPV6_POOLS"):
        next_vpc_cidr6([small], [str(small)])
    vpc = ipaddress.IPv6Network("fd00:7469:0:100::/56")
    assert next_subnet_cidr6(vpc, ["fd00:7469:0:100::/64", "fd00:7469:0:102::/64"]) == \
        ipaddress.IPv6Network("fd00:7469:0:101::/64")


def test_eui64_and_link_local_as_rfc_4291_forms_them() -> None:
    net = ipaddress.IPv6Network("2001:db8:1:2::/64")
    assert str(eui64(net, "52:54:00:12:34:56")) == "2001:db8:1:2:5054:ff:fe12:3456"
    assert str(link_local("0a:58:00:00:03:e8")) == "fe80::858:ff:fe00:3e8"


def test_fixed_addresses_and_the_next_free_one() -> None:
    net = ipaddress.IPv6Network("fd00::/64")
    for bad in ("fd00::", "fd00::1", "fd00:0:0:1::5", "fe80::5", "ff02::1", "::", "10.0.0.1"):
        with pytest.raises(Ipam6Error):
            check_fixed_ip6(net, bad)
    assert str(check_fixed_ip6(net, "fd00:0:0:0::a")) == "fd00::a"
    assert str(next_free6(net, [])) == "fd00::2"
    assert str(next_free6(net, ["fd00::2", "fd00::9"])) == "fd00::a"
    last = str(net.broadcast_address)
    assert str(next_free6(net, ["fd00::2", last])) == "fd00::3"  # the top is taken: the lowest gap


def test_only_unique_local_and_global_unicast_space_and_one_spelling() -> None:
    assert space_error6(parse_cidr6("fd12::/56", 56, 56)) is None
    assert space_error6(parse_cidr6("2001:db8::/56", 56, 56)) is None
    for bad in ("fe80::/56", "ff00::/56", "::/56", "fec0::/56", "100::/56"):
        assert space_error6(ipaddress.IPv6Network(bad)) is not None, bad
    for bad in ("fd12:0000::/56", "fd12::1/56", "fd12::/48", "10.0.0.0/8"):
        with pytest.raises(Ipam6Error):
            parse_cidr6(bad, 56, 56)
