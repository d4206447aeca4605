"""The load-balancer role: every instance serves every load balancer (active-active), with the same Maglev table
per pool, so a flow's member does not depend on the instance the vSwitch hashed it to.

Python builds the tables when a VPC's section changes (only the pools whose members, weights or settings changed)
and ends draining members' connections when their deregistration delay passes; per packet it is stage.LbStage
over the connection table (reference.LbTable, or native.NativeLb: the table and the Maglev lookup in C). A VPC's
listeners and members cross into C on their own (dp_set_lb_vpc).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.packet import PROTO_TCP, PROTO_UDP, ip2int
from nfv_gateways.core.role import PacketStage
from nfv_gateways.core.sections import VpcParts
from nfv_gateways.roles.lb import maglev
from nfv_gateways.roles.lb.reference import LbTable
from nfv_gateways.roles.lb.stage import LbStage, PoolSpec, VpcLb
from tianji.served import LbListenerServed, LbServed
from tianji.southbound import LbSection

if TYPE_CHECKING:
    from nfv_gateways.native.dataplane import NativeDataPlane

log = logging.getLogger("tianji.gateway")
PROTO = {"tcp": PROTO_TCP, "udp": PROTO_UDP}
MAX_POOLS = 4096  # native/lb_stage.c's


class LbRole:
    name = "lb"
    expiry_interval = 1.0  # draining members leave within a second of their delay

    def __init__(self, o: GatewayOptions, counters: Counter[str]) -> None:
        self.o, self.counters = o, counters
        self.pool_no: dict[tuple[str, str, int], int] = {}
        self.pool_sig: dict[int, tuple] = {}
        self.member_no: dict[str, int] = {}
        self.drains: dict[int, float] = {}  # pool -> the next drain deadline among its members
        self.listeners: dict[int, LbListenerServed] = {}  # pool -> its listener as served
        self.vpc_pools: dict[str, set[int]] = {}  # VPC id -> the pools of its listeners
        self.vpc_vni: dict[str, int] = {}  # VPC id -> the VNI its listeners are in C under
        self.dp: NativeDataPlane | None = None
        self.maglev: Any = maglev
        self.stage: LbStage | None = None
        self.crossed: Counter[str] = Counter()
        self.vip_eips: dict[str, set[str]] = {}  # VPC id -> its load balancers' EIPs (announced to an edge router)

    def table_args(self) -> tuple[int, float, int]:
        """(capacity, new entries per second, burst) of the connection table."""
        rate = self.o.lb_new_per_s
        return self.o.lb_connections, rate, max(1, int(rate / 10))

    def attach(self, dp: NativeDataPlane | None) -> PacketStage:
        self.dp = dp if dp is not None and dp.lib is not None else None
        if self.dp is None:  # no C library: the reference (behind a frames interface in tests)
            self.stage = LbStage(LbTable(*self.table_args()))
            return self.stage
        from nfv_gateways.roles.lb.native import NativeLb, NativeMaglev

        conns = NativeLb(*self.table_args(), lib=self.dp.lib)
        self.dp.use_lb(conns.h)
        self.maglev, self.stage = NativeMaglev(), LbStage(conns)
        return self.stage

    def policy_of(self, section: LbSection) -> tuple[LbServed, ...]:
        return tuple(section.lbs)

    def apply(self, parts: Mapping[str, VpcParts], touched: set[str], first: bool) -> None:
        """Each touched VPC on its own: number its pools and members, rebuild the pools whose content changed,
        swap its entries in the stage's policy and in C."""
        now = time.time()
        for vid in touched:
            p = parts.get(vid)
            part, pools = self._vpc_part(p, now) if p is not None else (None, set())
            for pool in self.vpc_pools.pop(vid, set()) - pools:  # the listener or its load balancer went
                self._drop_pool(pool)
            if pools:
                self.vpc_pools[vid] = pools
            self.vip_eips.pop(vid, None)
            if p is not None and (eips := {lb.eip for lb in p.policy if lb.eip}):
                self.vip_eips[vid] = eips
            assert self.stage is not None
            self.stage.policy.replace(vid, part)
            self._to_c(vid, p.vni if p is not None else None, part)
        self.counters["config_lb_applies"] += 1

    def _vpc_part(self, p: VpcParts, now: float) -> tuple[VpcLb, set[int]]:
        part, pools = VpcLb(), set()
        for lb in p.policy:
            vip = ip2int(lb.vip)
            if lb.eip:
                part.vip_eips[(lb.vni, vip)] = ip2int(lb.eip)
            for lst in lb.listeners:
                pool = self._pool_number((lb.id, lst.protocol, lst.port))
                pools.add(pool)
                part.listeners[(lb.vni, vip, PROTO[lst.protocol], lst.port)] = pool
                if lb.eip:
                    part.eip_listeners[(ip2int(lb.eip), PROTO[lst.protocol], lst.port)] = (lb.vni, vip, pool)
                for m in lst.members:
                    part.members[self._member_number(m.id)] = (lb.vni, ip2int(m.ip))
                self.listeners[pool] = lst
                self._set_pool(pool, lst, now)
        return part, pools

    def _to_c(self, vid: str, vni: int | None, part: VpcLb | None) -> None:
        if self.dp is None:
            return
        from nfv_gateways.roles.lb.native import listener_records

        if part is not None and not part.listeners and not part.members:
            part = None  # a VPC without load balancers has nothing in C
        old = self.vpc_vni.pop(vid, None)
        if old is not None and (part is None or old != vni):
            self.dp.lib.dp_remove_lb_vpc(self.dp.h, old)
            self.crossed["calls"] += 1
        if part is None or vni is None:
            return
        assert self.stage is not None
        source_ip = self.stage.source_ip
        ls = [(vip, proto, port, pool, pool in source_ip, part.vip_eips.get((v, vip), 0))
              for (v, vip, proto, port), pool in part.listeners.items()]
        rec = listener_records(ls, {i: ip for i, (_v, ip) in part.members.items()})
        if (h := self.dp.h) is not None and self.dp.lib.dp_set_lb_vpc(h, vni, rec[0], rec[1], rec[2], rec[3]) != 0:
            raise MemoryError("dp_set_lb_vpc failed (out of memory)")
        self.vpc_vni[vid] = vni
        self.crossed["calls"] += 1
        self.crossed["bytes"] += rec[4]

    def _drop_pool(self, pool: int) -> None:
        assert self.stage is not None
        self.stage.conns.set_pool(pool, [], [], 1.0)
        self.pool_no = {k: v for k, v in self.pool_no.items() if v != pool}
        self.pool_sig.pop(pool, None)
        self.listeners.pop(pool, None)
        self.drains.pop(pool, None)

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
        assert self.stage is not None
        self.stage.set_pool(pool, PoolSpec(table, ids, lst.idle_timeout_s, lst.algorithm == "source_ip"))
        self.pool_sig[pool] = sig
        deadlines = [m.drain_until for m in members if m.weight == 0 and m.drain_until]
        if deadlines:
            self.drains[pool] = min(deadlines)
        else:
            self.drains.pop(pool, None)
        self.counters["pool_builds"] += 1

    def edge_addresses(self) -> set[str]:
        """Every load balancer's EIP: every instance serves it alike, so each announces it (ECMP at the edge)."""
        return set().union(*self.vip_eips.values())

    def expire(self, now: float) -> None:
        """Draining members whose delay passed leave their pools: their connections end."""
        for pool, at in list(self.drains.items()):
            if at <= now and pool in self.listeners:
                self._set_pool(pool, self.listeners[pool], now)

    def status(self) -> dict:
        assert self.stage is not None
        conns = self.stage.conns
        held = conns.held() if hasattr(conns, "held") else len(conns.conns)
        return {"lb": dict(self.stage.counters) | dict(conns.counters), "connections": held,
                "pools": len(self.pool_no), "lb_crossed": dict(self.crossed)}
