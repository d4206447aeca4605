"""The load-balancer role of the gateway framework: every instance serves every load balancer (active-active), with
the same Maglev table per pool, so a flow's member does not depend on the instance the vSwitch hashed it to.

Python builds the tables when sections change (only the pools whose members, weights or settings changed) and ends
draining members' connections when their deregistration delay passes; per packet it is lb_stage.LbStage over the
connection table (LbTable, or NativeLb: the table and the Maglev lookup in C).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nfv_gateways import maglev
from nfv_gateways.framework import Gateway, PacketStage, VpcParts
from nfv_gateways.lb import LbTable
from nfv_gateways.lb_stage import LbPolicy, LbStage, PoolSpec
from nfv_gateways.packet import PROTO_TCP, PROTO_UDP, ip2int
from tianji.southbound import GatewaySection, LbListenerServed

log = logging.getLogger("tianji.gateway")
PROTO = {"tcp": PROTO_TCP, "udp": PROTO_UDP}
MAX_POOLS = 4096  # native/lb_stage.c's


class LbGateway(Gateway):
    role = "lb"
    expiry_interval = 1.0  # draining members leave within a second of their delay

    def make_stage(self) -> tuple[PacketStage, str]:
        fp = self.o.fastpath
        self.pool_no: dict[tuple[str, str, int], int] = {}
        self.pool_sig: dict[int, tuple] = {}
        self.member_no: dict[str, int] = {}
        self.drains: dict[int, float] = {}  # pool -> the next drain deadline among its members
        self.listeners: dict[int, LbListenerServed] = {}  # pool -> its listener as served
        if self.dp is not None:  # given by the caller (tests)
            self.maglev = maglev.NativeMaglev()
            return LbStage(self.dp.lb), self.dp.backend
        if (dp := self.native_dataplane("lb")) is not None:
            self.dp, self.maglev = dp, maglev.NativeMaglev()
            return LbStage(dp.lb), f"{dp.backend} (packet I/O, new and established connections in C)"
        if fp == "auto":
            log.warning("no native data plane started: using the Python path")
        self.maglev: Any = maglev
        return LbStage(LbTable(*self.lb_table_args())), "python"

    def policy_of(self, section: GatewaySection) -> tuple:
        return tuple(section.lbs)

    def apply_policy(self, parts: dict[str, VpcParts], touched: set[str], first: bool) -> None:
        """Number the pools and members, rebuild the pools whose content changed, and swap the lookups whole."""
        policy, now, live = LbPolicy(), time.time(), set()
        for vid in sorted(parts):
            for lb in parts[vid].policy:
                vip = ip2int(lb.vip)
                if lb.eip:
                    policy.vip_eips[(lb.vni, vip)] = ip2int(lb.eip)
                for lst in lb.listeners:
                    pool = self._pool_number((lb.id, lst.protocol, lst.port))
                    live.add(pool)
                    policy.listeners[(lb.vni, vip, PROTO[lst.protocol], lst.port)] = pool
                    if lb.eip:
                        policy.eip_listeners[(ip2int(lb.eip), PROTO[lst.protocol], lst.port)] = (lb.vni, vip, pool)
                    for m in lst.members:
                        policy.members[self._member_number(m.id)] = (lb.vni, ip2int(m.ip))
                    self.listeners[pool] = lst
                    self._set_pool(pool, lst, now)
        for key, pool in list(self.pool_no.items()):
            if pool not in live:  # the listener or its load balancer went
                self.table.conns.set_pool(pool, [], [], 1.0)
                del self.pool_no[key]
                self.pool_sig.pop(pool, None)
                self.listeners.pop(pool, None)
                self.drains.pop(pool, None)
        self.table.policy = policy
        if self.dp is not None:
            self.dp.set_lb([(vni, vip, proto, port, pool, pool in self.table.source_ip,
                             policy.vip_eips.get((vni, vip), 0))
                            for (vni, vip, proto, port), pool in policy.listeners.items()], policy.members)
        self.counters["config_lb_applies"] += 1

    def _pool_number(self, key: tuple[str, str, int]) -> int:
        if key not in self.pool_no:
            used = set(self.pool_no.values())
            free = next((i for i in range(MAX_POOLS) if i not in used), None)
            if free is None:
                raise RuntimeError(f"more than {MAX_POOLS} listeners on one instance")
            self.pool_no[key] = free
        return self.pool_no[key]

    def _member_number(self, member_id: str) -> int:
        return self.member_no.setdefault(member_id, len(self.member_no))

    def _set_pool(self, pool: int, lst: LbListenerServed, now: float) -> None:
        """The pool's table from its members with weight, its ids with the draining ones whose delay runs."""
        members = [m for m in lst.members if m.weight > 0 or (m.drain_until or 0) > now]
        sig = (tuple((m.id, m.weight) for m in members), lst.table_size, lst.algorithm, lst.idle_timeout_s)
        if self.pool_sig.get(pool) == sig:
            return
        weighted = [m for m in members if m.weight > 0]
        table = self.maglev.build([maglev.member_key(m.id) for m in weighted], [m.weight for m in weighted],
                                  lst.table_size)
        # the table indexes the weighted members; the draining follow them in `ids`
        ids = tuple(self._member_number(m.id) for m in weighted + [m for m in members if m.weight == 0])
        self.table.set_pool(pool, PoolSpec(table, ids, lst.idle_timeout_s, lst.algorithm == "source_ip"))
        self.pool_sig[pool] = sig
        deadlines = [m.drain_until for m in members if m.weight == 0 and m.drain_until]
        if deadlines:
            self.drains[pool] = min(deadlines)
        else:
            self.drains.pop(pool, None)
        self.counters["pool_builds"] += 1

    def expire_role(self, now: float) -> None:
        """Draining members whose delay passed leave their pools: their connections end."""
        for pool, at in list(self.drains.items()):
            if at <= now and pool in self.listeners:
                self._set_pool(pool, self.listeners[pool], now)

    def role_status(self) -> dict:
        conns = self.table.conns
        held = conns.held() if hasattr(conns, "held") else len(conns.conns)
        return {"lb": dict(self.table.counters) | dict(conns.counters), "connections": held,
                "pools": len(self.pool_no)}
