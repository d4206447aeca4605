"""The load balancer instance's semantics, the Python reference of native/lb_stage.c's connection table.

An instance holds its pools (each a Maglev table over its members, their stable ids, and its connections' idle
timeout) and a table of connections. A packet's member: its connection's, while the connection is not idle past
the timeout and its member is still in the pool (draining members are: their connections go on); otherwise the
pool's Maglev entry for the packet's 5-tuple, remembered while the table has room (3/4 of `capacity`) and the rate
of new entries allows (a token bucket): under a SYN flood the established keep their entries and new connections
are still decided, by Maglev alone, identically on every instance (`fallback`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from nfv_gateways.roles.lb.maglev import flow_hash
from tianji.ratelimit import TokenBucket

Key = tuple[int, int, int, int, int, int, int]  # pool, vni, src, dst, sport, dport, proto


@dataclass
class Pool:
    table: list[int]
    ids: list[int]
    idle: float


class LbTable:
    def __init__(self, capacity: int = 1 << 20, new_per_s: float = 100_000.0, burst: int = 10_000) -> None:
        self.capacity = capacity
        self.pools: dict[int, Pool] = {}
        self.conns: dict[Key, list] = {}  # key -> [member, deadline]
        self.bucket = TokenBucket(new_per_s, burst, 0.0)
        self.counters: Counter[str] = Counter()

    def set_pool(self, pool: int, table: list[int], ids: list[int], idle: float) -> None:
        self.pools[pool] = Pool(list(table), list(ids), idle)

    def pick(self, pool: int, vni: int, src: int, dst: int, sport: int, dport: int, proto: int,
             now: float) -> int:
        p = self.pools.get(pool)
        if p is None:
            self.counters["misses"] += 1
            return -1
        key = (pool, vni, src, dst, sport, dport, proto)
        if (c := self.conns.get(key)) is not None:
            if now <= c[1] and c[0] in p.ids:
                c[1] = now + p.idle
                self.counters["hits"] += 1
                return c[0]
            del self.conns[key]
        idx = p.table[flow_hash(src, dst, sport, dport, proto) % len(p.table)] if p.table else -1
        if not 0 <= idx < len(p.ids):
            self.counters["misses"] += 1
            return -1
        member = p.ids[idx]
        if len(self.conns) < self.capacity // 4 * 3 and self._token(now):
            self.conns[key] = [member, now + p.idle]
            self.counters["new"] += 1
        else:
            self.counters["fallback"] += 1
        return member

    def _token(self, now: float) -> bool:
        return self.bucket.take(now) == 0.0

    def expire(self, now: float) -> int:
        gone = [k for k, c in self.conns.items() if now > c[1]]
        for k in gone:
            del self.conns[k]
        return len(gone)


__all__ = ["LbTable"]
