"""The controller's full garbage collections run when writes pause, not in the middle of a burst."""

from __future__ import annotations

import gc
import weakref

from controller.serving import Collector


class Clock:
    """A clock the test moves: a collection on a loaded machine takes as long as it takes, the schedule must not."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_collects_when_idle_and_at_the_latest_after_most() -> None:
    clock = Clock()
    c = Collector(idle_after=0.05, least=0.1, most=0.4, clock=clock)
    assert not c.tick(None)  # just collected (at start)
    clock.now += 0.12
    assert not c.tick(clock.now)  # writes are arriving: wait
    assert c.tick(clock.now - 0.06)  # a pause in the writes: collect now
    assert not c.tick(None)
    clock.now += 0.42
    assert c.tick(clock.now)  # busy all along, but not longer than `most`


def test_survivors_are_frozen_and_the_frozen_heap_is_collected_every_whole() -> None:
    class Node:
        pass

    clock = Clock()
    c = Collector(idle_after=0.0, least=0.0, most=0.0, whole=0.3, clock=clock)
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    try:
        clock.now += 0.01
        assert c.tick(None)
        assert gc.get_freeze_count() > 0  # the survivors (our cycle among them) are left out of the next walk
        del a, b
        clock.now += 0.01
        assert c.tick(None)
        assert gone() is not None  # frozen: not walked
        clock.now += 0.31
        assert c.tick(None)
        assert gone() is None  # the whole heap's collection found it
    finally:
        gc.unfreeze()
