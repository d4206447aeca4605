"""The controller's full garbage collections run when writes pause, not in the middle of a burst."""

from __future__ import annotations

import time

from controller.serving import Collector


def test_collects_when_idle_and_at_the_latest_after_most() -> None:
    c = Collector(idle_after=0.05, least=0.1, most=0.4)
    assert not c.tick(None)  # just collected (at start)
    time.sleep(0.12)
    assert not c.tick(time.monotonic())  # writes are arriving: wait
    assert c.tick(time.monotonic() - 0.06)  # a pause in the writes: collect now
    assert not c.tick(None)
    time.sleep(0.42)
    assert c.tick(time.monotonic())  # busy all along, but not longer than `most`
