"""The compiled-fragment cache (controller/southbound/fragments.py): fragments nobody used for a while go (a
deleted VPC's are never asked for again), those in use stay, and the LRU bound holds."""

from __future__ import annotations

import time

from controller.southbound.fragments import FragmentCache


class _Session:
    def get_bind(self) -> str:
        return "db"


def test_fragments_unused_for_a_while_go_and_those_in_use_stay() -> None:
    s, cache = _Session(), FragmentCache(100, idle_s=0.2)
    cache.put(s, ("endpoints", "deleted-vpc"), 5, ("a",))
    cache.put(s, ("endpoints", "live-vpc"), 5, ("b",))
    for _ in range(4):
        time.sleep(0.07)
        assert cache.get(s, ("endpoints", "live-vpc"), 5) == ("b",)  # asked for: stays
        cache.put(s, ("subnets", "live-vpc"), 7, ("c",))
    assert cache.get(s, ("endpoints", "deleted-vpc"), 5) is None
    assert set(cache.data) == {("db", "endpoints", "live-vpc"), ("db", "subnets", "live-vpc")}
    assert set(cache.used) == set(cache.data)


def test_the_bound_holds_least_recently_used_first() -> None:
    s, cache = _Session(), FragmentCache(3)
    for i in range(3):
        cache.put(s, ("k", i), 1, (i,))
    assert cache.get(s, ("k", 0), 1) == (0,)
    cache.put(s, ("k", 3), 1, (3,))
    assert cache.get(s, ("k", 1), 1) is None and cache.get(s, ("k", 0), 1) == (0,)
    assert len(cache.data) == len(cache.used) == 3
