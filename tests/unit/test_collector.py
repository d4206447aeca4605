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


def test_survivors_are_frozen_and_the_frozen_heap_is_collected_every_whole() -> None:
    import gc
    import weakref

    class Node:
        pass

    c = Collector(idle_after=0.0, least=0.0, most=0.0, whole=0.3)
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    try:
        assert c.tick(None)
        assert gc.get_freeze_count() > 0  # the survivors (our cycle among them) are left out of the next walk
        del a, b
        assert c.tick(None)
        assert gone() is not None  # frozen: not walked
        time.sleep(0.31)
        assert c.tick(None)
        assert gone() is None  # the whole heap's collection found it
    finally:
        gc.unfreeze()
