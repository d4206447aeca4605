"""The service endpoints' ConnStore on a native data plane (include/tj_svc.h, native/dp_svc.c): C holds, carries
and expires the connections it can carry alone; those it cannot (PROXY v2 rewrites the stream; a hash twin of
another connection's key) stay in this store's dicts. A lookup asks the dicts, then C; a write goes to the owner."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from nfv_gateways.native.api import constants, structure
from nfv_gateways.roles.service.conns import TIMEOUT_ESTABLISHED, TIMEOUT_TRANSITORY, TIMEOUT_UDP, Conn, DictConns

if TYPE_CHECKING:
    from nfv_gateways.native.dataplane import NativeDataPlane

LIST_CHUNK = 1024


class NativeConns:
    def __init__(self, dp: NativeDataPlane, endpoints: dict) -> None:
        self.dp, self.endpoints, self.py = dp, endpoints, DictConns()
        self.rec, self._one = structure("tj_svc_conn_t"), structure("tj_svc_conn_t")()
        k = constants(dp.lib)
        self._out_taken, self._in_taken = k["TJ_SVC_OUT_TAKEN"], k["TJ_SVC_IN_TAKEN"]
        dp.lib.dp_use_svc(dp.h)
        dp.lib.dp_svc_set_timeouts(dp.h, TIMEOUT_ESTABLISHED, TIMEOUT_TRANSITORY, TIMEOUT_UDP)
        dp.cache_in_use = True  # its established connections are the XDP flow cache's (xdp backend)

    def _call(self, fn: str, *args: object) -> Any:
        if (h := self.dp.h) is None:
            return -1  # closed: a config arriving while the instance stops
        self.dp.crossed["calls"] += 1
        return getattr(self.dp.lib, fn)(h, *args)

    def _record(self, c: Conn) -> ctypes.Structure:
        e, r = c.ep, self._one
        (r.vni, r.vm, r.ep_ip, r.svc, r.source, r.via_vni, r.mtu, r.back_vni, r.vm_port, r.port, r.sport, r.proto,
         r.state, r.last) = (e.vni, c.vm, e.ip, c.svc, e.source, e.via_vni, e.mtu, c.back, c.vm_port, c.port,
                             c.sport, c.proto, int(c.established) | int(c.closing) << 1, c.last)
        return r

    def _conn(self, r: ctypes.Structure) -> Conn | None:
        ep = self.endpoints.get((r.vni, r.ep_ip))
        return None if ep is None else Conn(ep, r.vm, r.vm_port, r.proto, r.port, r.svc, r.sport, r.last,
                                            bool(r.state & 1), bool(r.state & 2), r.back_vni)

    def find_in(self, key: tuple) -> Conn | None:
        if (c := self.py.find_in(key)) is not None:
            return c
        return self._conn(self._one) if self._call("dp_svc_get_in", *key, ctypes.byref(self._one)) == 0 else None

    def find_out(self, key: tuple) -> Conn | None:
        if (c := self.py.find_out(key)) is not None:
            return c
        return self._conn(self._one) if self._call("dp_svc_get_out", *key, ctypes.byref(self._one)) == 0 else None

    def add(self, c: Conn) -> bool:
        if c.outside() in self.py.outside:
            return False
        if c.pp is not None:  # Python's alone: its outside key must be free in C as well
            return self._call("dp_svc_get_out", *c.outside(), ctypes.byref(self.rec())) != 0 and self.py.add(c)
        r = self._call("dp_svc_add", ctypes.byref(self._record(c)))
        if r == self._in_taken:
            self.dp.crossed["kept_in_python"] += 1
            return self.py.add(c)
        if r < 0 and self.dp.h is not None:
            raise MemoryError("dp_svc_add failed (out of memory)")
        return r == 0

    def put(self, c: Conn) -> None:
        if self.py.find_in(c.inside()) is None:
            self._call("dp_svc_put", ctypes.byref(self._record(c)))

    def drop(self, c: Conn) -> None:
        if self.py.find_in(c.inside()) is not None:
            self.py.drop(c)
        else:
            self._call("dp_svc_del", ctypes.byref(self._record(c)))

    def conns(self, vni: int | None = None) -> list[Conn]:
        out, buf, cursor = self.py.conns(vni), (self.rec * LIST_CHUNK)(), ctypes.c_uint32(0)
        while (n := self._call("dp_svc_list", vni or 0, int(vni is None), buf, LIST_CHUNK, ctypes.byref(cursor))) > 0:
            out += [c for i in range(n) if (c := self._conn(buf[i])) is not None]
            if n < LIST_CHUNK:
                break
        return out

    def expire(self, now: float) -> int:
        return self.py.expire(now) + max(self._call("dp_svc_expire", now), 0)

    def __len__(self) -> int:
        return len(self.py) + max(self._call("dp_svc_count"), 0)


__all__ = ["NativeConns"]
