"""Waiting for a condition, with a deadline that says what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> float:
    """Seconds until `cond()` held; AssertionError naming `what` after `timeout`."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - t0
