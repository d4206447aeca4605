"""Named points where a test makes this process die as `kill -9` would (`TIANJI_FAILPOINT=name[,name]`), so that
crash safety is tested at the exact step rather than by luck. Unset (production): one set lookup."""

from __future__ import annotations

import os

ARMED = frozenset(filter(None, os.environ.get("TIANJI_FAILPOINT", "").split(",")))


def point(name: str) -> None:
    if name in ARMED:
        os._exit(137)  # no cleanup, no flush, no answer: what a SIGKILL leaves
