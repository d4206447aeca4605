"""An instance stopping: its status, punt and config threads may still call the data plane after close(); every
call then does nothing (a NULL handle passed to C crashed the process: seen as a segfault in dp_stats at exit)."""

from __future__ import annotations

import time

from nfv_gateways.core.packet import ip2int
from nfv_gateways.native.dataplane import UL, NativeDataPlane


def test_calls_after_close_do_nothing() -> None:
    dp = NativeDataPlane("mem", "t", "ul0", "ext0", b"\x02" + bytes(5), b"\x02" + bytes(4) + b"\x01",
                         ip2int("198.18.0.1"))
    assert isinstance(dp.stats(), dict)
    dp.close()
    dp.close()  # twice: still nothing
    assert all(v == 0 for v in dp.stats().values())
    t0 = time.monotonic()
    assert dp.punt(50) == []
    assert time.monotonic() - t0 >= 0.04  # waits like a live punt, so a punt loop does not spin at exit
    assert dp.inject(UL, b"\0" * 60) is False
    dp.set_neigh(UL, ip2int("198.18.0.2"), b"\x02" * 6)
    dp.set_vteps([ip2int("198.18.0.2")])
    dp.set_vpc(1001, b"\x0a" * 6, [])
    dp.remove_vpc(1001)
    assert dp.held() == {}
