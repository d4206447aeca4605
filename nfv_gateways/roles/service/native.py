"""The service endpoint's native stage (native/dp_svc.c, include/tj_svc.h) behind ctypes: the reference decides
every new connection and keeps its timers; each connection C may carry alone (not PROXY v2: that rewrites the
stream) crosses into C once, when admitted, and out when it ends. C carries its handshake and its end as well and
tracks its state as the reference does; the changes come back through `absorb` (at least every 100 ms, and before
the timers are looked at)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from nfv_gateways.native.api import structure
from nfv_gateways.roles.service.reference import Conn, Inside, ServiceTable

if TYPE_CHECKING:
    from nfv_gateways.native.dataplane import NativeDataPlane


class NativeServiceTable(ServiceTable):
    """ServiceTable whose plain connections are also the C stage's (`dp`'s loop runs it)."""

    def __init__(self, dp: NativeDataPlane) -> None:
        super().__init__()
        self.dp = dp
        self.conn_t = structure("tj_svc_conn_t")
        self.event_t = structure("tj_svc_event_t")
        self._events = (self.event_t * 256)()
        self.in_c: dict[Inside, Any] = {}  # what C holds, as it was handed over (deleted by the same record)
        dp.lib.dp_use_svc(dp.h)
        dp.cache_in_use = True  # its established connections are the XDP flow cache's (xdp backend)

    def _carry(self, c: Conn) -> None:
        if c.pp is not None:
            return
        e = c.ep
        rec = self.conn_t(e.vni, c.vm, e.ip, c.svc, e.source, e.via_vni, e.mtu, c.back, c.vm_port, c.port, c.sport,
                          c.proto, int(c.established) | int(c.closing) << 1)
        r = self._call("dp_svc_add", ctypes.byref(rec))
        if r == 0:
            self.in_c[c.inside()] = rec
        elif r < 0:
            raise MemoryError("dp_svc_add failed (out of memory)")
        else:
            self.counters["kept_in_python"] += 1  # its keys taken in C (a hash twin): the reference carries it

    def _forget(self, c: Conn) -> None:
        if (rec := self.in_c.pop(c.inside(), None)) is not None:
            self._call("dp_svc_del", ctypes.byref(rec))

    def _seen(self, c: Conn) -> float:
        rec = self.in_c.get(c.inside())
        return max(c.last, self._call("dp_svc_last", ctypes.byref(rec)) or 0.0) if rec is not None else c.last

    def absorb(self) -> None:
        """The state changes C made (a handshake finished, a FIN or RST), into the connections they are of."""
        while (n := self._call("dp_svc_events", self._events, len(self._events))) != 0:
            if n < 0:  # more than C keeps between two drains: read every connection's state again
                for key, rec in self.in_c.items():
                    if (c := self.inside.get(key)) is not None:
                        self._merge(c, self._call("dp_svc_state", ctypes.byref(rec)))
                return
            for ev in self._events[:n]:
                r = ev.conn
                if (c := self.inside.get((r.vni, r.vm, r.vm_port, r.proto, r.ep_ip, r.port))) is not None:
                    self._merge(c, ev.state)
            if n < len(self._events):
                return

    @staticmethod
    def _merge(c: Conn, state: int) -> None:
        if state > 0:
            c.established |= bool(state & 1)
            c.closing |= bool(state & 2)

    def expire(self, now: float) -> int:
        self.absorb()
        return super().expire(now)

    def _call(self, fn: str, *args: object) -> Any:
        if (h := self.dp.h) is None:
            return 0  # closed: a config arriving while the instance stops
        self.dp.crossed["calls"] += 1
        return getattr(self.dp.lib, fn)(h, *args)


__all__ = ["NativeServiceTable"]
