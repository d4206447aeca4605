"""The service endpoint's native stage (native/dp_svc.c, include/tj_svc.h) behind ctypes: the reference's
decisions over `NativeConns` (c_conns.py), whose connections C holds, carries and expires, but for those it cannot
carry (PROXY v2, a hash twin), which stay in its dicts: one owner for each connection."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nfv_gateways.roles.service.c_conns import NativeConns
from nfv_gateways.roles.service.reference import ServiceTable

if TYPE_CHECKING:
    from nfv_gateways.native.dataplane import NativeDataPlane


class NativeServiceTable(ServiceTable):
    """ServiceTable over NativeConns (`dp`'s loop carries the connections C holds)."""

    def __init__(self, dp: NativeDataPlane) -> None:
        super().__init__()
        self.conns = NativeConns(dp, self.endpoints)


__all__ = ["NativeConns", "NativeServiceTable"]
