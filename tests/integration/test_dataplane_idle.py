"""An idle gateway sleeps. Python's inject writes the loop's eventfd after queueing a frame; when the loop drained
the queue before that write landed, the wake-up stayed pending with nothing to send, and poll() returned at once
for ever: a gateway with no traffic burnt a core (two of four in the emulated cluster, found under iperf3).
Here that state is set up on purpose (queue a frame, let one pass of the loop send it, then start the loop), and
then raced for (bursts of injects into the running loop; before the fix that alone failed about one run in three)."""

from __future__ import annotations

import sys

import pytest

from topologies.gwlab import GatewayLab

SCRIPT = """
import os, sys, time
from nfv_gateways.native.dataplane import UL, NativeDataPlane
from nfv_gateways.core.packet import ip2int
dp = NativeDataPlane(sys.argv[1], "idle", "ul0", "ext0", b"\\x02" + bytes(5), b"\\x02" + bytes(4) + b"\\x01",
                     ip2int("172.30.0.1"))
try:
    frame = bytes.fromhex("ff" * 12 + "0806") + bytes(46)  # a broadcast ARP-typed frame
    assert dp.inject(UL, frame)
    dp.poll()  # sends the frame; the eventfd's wake-up is still pending
    dp.start()
    for burst in range(1, 200):  # and the race itself: the last inject of a burst while the loop drains
        for _ in range(burst % 7 + 1):
            dp.inject(UL, frame)
        time.sleep(0.001)
    time.sleep(0.3)
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(1.0)
    print(round((time.process_time() - c0) / (time.monotonic() - t0), 3))
finally:
    dp.close()
"""


@pytest.mark.parametrize("backend", ["xdp", "packet"])
def test_a_pending_wakeup_with_nothing_to_send_does_not_keep_the_loop_awake(backend: str) -> None:
    lab = GatewayLab(f"tji{backend[0]}")
    try:
        lab.plumb("tianji")
        r = lab.exec(lab.gw, sys.executable, "-c", SCRIPT, backend, check=False)
        assert r.returncode == 0, r.stderr[-800:]
        share = float(r.stdout.split()[-1])
        assert share < 0.1, f"the idle {backend} loop used {share:.0%} of a core"  # 100 ms poll timeouts: ~0%
    finally:
        lab.down()
