"""The load balancer's native stage (native/lb_stage.c, include/tj_lb.h) behind ctypes: the connection table and
Maglev's build in C, with the interfaces of reference.LbTable and maglev.build, and the data plane's per-VPC
listeners and members (`listener_records`)."""

from __future__ import annotations

import ctypes
from collections import Counter

from nfv_gateways.native.api import load, structure
from nfv_gateways.roles.lb.maglev import DEFAULT_M


class NativeLb:
    """LbTable's interface over native/_lb.so."""

    def __init__(self, capacity: int = 1 << 20, new_per_s: float = 100_000.0, burst: int = 10_000,
                 lib: ctypes.CDLL | None = None) -> None:
        """`lib`: a data plane's library, whose packet loop then shares this table (default: _lb.so alone)."""
        self.lib = lib or load("_lb.so")
        self.h = self.lib.lb_create(capacity, new_per_s, burst)
        if not self.h:
            raise MemoryError("lb_create failed")

    def close(self) -> None:
        if self.h:
            self.lib.lb_destroy(self.h)
            self.h = None

    def __del__(self) -> None:
        self.close()

    def set_pool(self, pool: int, table: list[int], ids: list[int], idle: float) -> None:
        m, n = len(table), len(ids)
        if self.lib.lb_set_pool(self.h, pool, (ctypes.c_int32 * max(m, 1))(*table), m,
                                (ctypes.c_uint32 * max(n, 1))(*ids), n, idle) != 0:
            raise ValueError("lb_set_pool failed (pool number too large, or out of memory)")

    def pick(self, pool: int, vni: int, src: int, dst: int, sport: int, dport: int, proto: int,
             now: float) -> int:
        return self.lib.lb_pick(self.h, pool, vni, src, dst, sport, dport, proto, now)

    def expire(self, now: float) -> int:
        return self.lib.lb_expire(self.h, now)

    @property
    def counters(self) -> Counter[str]:
        out = (ctypes.c_uint64 * 5)()
        self.lib.lb_stats(self.h, out)
        return +Counter(dict(zip(("hits", "new", "fallback", "misses"), out[:4], strict=True)))

    def held(self) -> int:
        out = (ctypes.c_uint64 * 5)()
        self.lib.lb_stats(self.h, out)
        return out[4]


class NativeMaglev:
    """The C build (native/_lb.so), for the gateway's data plane and the benchmark."""

    def __init__(self) -> None:
        self.lib = load("_lb.so")

    def build(self, keys: list[int], weights: list[int], m: int = DEFAULT_M) -> list[int]:
        return list(self.build_raw(keys, weights, m))

    def build_raw(self, keys: list[int], weights: list[int], m: int = DEFAULT_M) -> ctypes.Array:
        """The table as a C array (what the data plane takes, no Python list made)."""
        n = len(keys)
        table = (ctypes.c_int32 * m)()
        if self.lib.maglev_build((ctypes.c_uint64 * max(n, 1))(*keys), (ctypes.c_uint32 * max(n, 1))(*weights), n, m,
                                 table) != 0:
            raise ValueError(f"maglev_build failed: {m} is not a prime, or out of memory")
        return table

    def flow_hash(self, src: int, dst: int, sport: int, dport: int, proto: int) -> int:
        return self.lib.maglev_flow_hash(src, dst, sport, dport, proto)


def listener_records(listeners: list[tuple[int, int, int, int, bool, int]],
                     members: dict[int, int]) -> tuple[ctypes.Array, int, ctypes.Array, int, int]:
    """One VPC's listeners (VIP, protocol, port, pool, hashes on the source alone, the VIP's EIP homed here or 0)
    and members (number -> address) as dp_set_lb_vpc takes them, and the bytes that cross."""
    lt, mt = structure("tj_lb_listener_t"), structure("tj_lb_member_t")
    ls = (lt * max(len(listeners), 1))(*[lt(vip, eip, pool, port, proto == 17, src_only)
                                         for vip, proto, port, pool, src_only, eip in listeners])
    ms = (mt * max(len(members), 1))(*[mt(i, ip) for i, ip in members.items()])
    return ls, len(listeners), ms, len(members), len(listeners) * ctypes.sizeof(lt) + len(members) * ctypes.sizeof(mt)


__all__ = ["NativeLb", "NativeMaglev", "listener_records"]
