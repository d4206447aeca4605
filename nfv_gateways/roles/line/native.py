"""The private line's native stage (native/dp_line.c, include/tj_line.h) behind ctypes: the reference's table
(policy and the slow path stay in Python), mirrored into the data plane as the packets need it, a VLAN's line
and a VNI's routes each crossing alone."""

from __future__ import annotations

import ctypes
from collections import Counter
from typing import TYPE_CHECKING

from nfv_gateways.native.api import structure
from nfv_gateways.roles.line.reference import Line, LineTable

if TYPE_CHECKING:
    from nfv_gateways.native.dataplane import NativeDataPlane


class NativeLineTable(LineTable):
    """LineTable whose lines, routes and customer routers are also the C stage's (`dp`'s loop runs it)."""

    def __init__(self, dp: NativeDataPlane, handoff_mtu: int, counters: Counter[str]) -> None:
        super().__init__(handoff_mtu, counters)
        self.dp = dp
        self.line_t, self.route_t = structure("tj_line_t"), structure("tj_line_route_t")
        self.max_sessions = len(self.line_t().locals)
        dp.lib.dp_use_line(dp.h, handoff_mtu)
        dp.cache_in_use = True  # its flows are the XDP flow cache's after their first packet (xdp backend)

    def set_line(self, line: Line) -> None:
        old = self.lines.get(line.id)
        super().set_line(line)
        if old is not None and old.vlan != line.vlan:
            self._call("dp_remove_line", old.vlan)
        if len(line.sessions) > self.max_sessions:
            raise ValueError(f"line {line.id}: {len(line.sessions)} sessions, the stage knows {self.max_sessions}")
        locals_ = [s.local for s in line.sessions]
        rec = self.line_t(line.vni, line.vpc[0], line.vpc[1], line.mtu,
                          (ctypes.c_uint32 * self.max_sessions)(*locals_), line.vlan, len(locals_))
        if self._call("dp_set_line", ctypes.byref(rec), size=ctypes.sizeof(rec)) != 0:
            raise MemoryError("dp_set_line failed (out of memory)")

    def remove_line(self, line_id: str) -> None:
        old = self.lines.get(line_id)
        super().remove_line(line_id)
        if old is not None:
            self._call("dp_remove_line", old.vlan)

    def _route(self, vni: int) -> None:
        super()._route(vni)
        rows = self.routes.get(vni, [])
        recs = (self.route_t * max(len(rows), 1))(*[self.route_t(net, plen, hop, line.vlan, 0)
                                                    for net, _mask, plen, line, hop, _local in rows])
        if self._call("dp_set_line_routes", vni, recs, len(rows), size=len(rows) * ctypes.sizeof(self.route_t)):
            raise MemoryError("dp_set_line_routes failed (out of memory)")

    def set_neigh(self, vlan: int, ip: int, mac: bytes) -> None:
        if self._call("dp_set_line_neigh", vlan, ip, mac, size=10) != 0:
            raise MemoryError("dp_set_line_neigh failed (out of memory)")

    def _call(self, fn: str, *args: object, size: int = 0) -> int:
        if (h := self.dp.h) is None:
            return 0  # closed: a config arriving while the instance stops
        self.dp.crossed["calls"] += 1
        self.dp.crossed["bytes"] += size
        return getattr(self.dp.lib, fn)(h, *args)


__all__ = ["NativeLineTable"]
