"""The audit: br-int read back in the background, chunk by chunk, and put right (`switch.audit_chunk`).

A chunk is asked for and not waited on. The switch walks every flow to answer it, which at 100,000 flows takes it
tens of milliseconds, longer when it is busy adding a port; a tenant's change that comes meanwhile is computed and
sent at once instead of queueing behind the reply in the agent. The switch applies that change after its walk (one
connection's messages are handled in order), so the chunk shows the flows as they were before the change: the
cookies a change touched after the request are left out of that chunk's repairs, and the next sweep sees them.

Pacing: at full speed until a connection's first sweep is done; then no chunk within `audit_quiet` of a change
(unless `audit_max_defer` has passed), a sweep taking at least `audit_interval`, at most `audit_rate` flows walked
a second, and the switch's own answer time counted: after a chunk that took d, the next waits at least 3d, so the
audit takes at most a quarter of a busy switch. Flows just installed are read back first, by cookie (the switch
looks those up in its cookie index), to take the baseline an edit by hand is recognised against; that is asked
for and not waited on either (right after a port is added the switch can take 100 ms to answer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vswitch_agent.engine import FlowEngine
from vswitch_agent.flow import Flow
from vswitch_agent.host import AgentOptions
from vswitch_agent.switch import VERIFY_MAX, Session, audit_chunk, n_chunks, take_baselines

log = logging.getLogger("tianji.agent")
ANSWER_TIMEOUT = 30.0  # seconds a read-back may stay unanswered before it is given up (and reported)


@dataclass
class Pending:
    """A read-back asked for (chunk i of n, or n == 0: flows just installed, by cookie), and the cookies changes
    touched since."""

    session: Session
    i: int
    n: int
    xids: list[int]
    asked: float
    touched: set[int] = field(default_factory=set)


class Audit:
    def __init__(self, opts: AgentOptions, engine: FlowEngine, state: dict[str, Any],
                 wake: Callable[[], None]) -> None:
        """Runs on the agent's program thread (its one writer to the switch). `wake` asks for another pass (the
        first sweep's end makes the agent report the switch synced); `state` gets the counters."""
        self.opts, self.engine, self.state, self.wake = opts, engine, state, wake
        self.baseline: dict[int, int] = {}  # cookie -> hash of its bytes as first read back
        self.verify: set[int] = set()  # cookies just installed, read back at once to take their baseline
        self.pos, self.next = 0, 0.0
        self.last_change = self.last_chunk = 0.0  # monotonic: when a change was programmed, a chunk asked for
        self.pending: Pending | None = None

    def connected(self) -> None:
        """A new connection: a sweep from the start, at full speed."""
        self.pos, self.next, self.pending = 0, 0.0, None

    def changed(self, add: Iterable[Flow], delete: Iterable[int]) -> None:
        """A change just sent for the tenants' side (a config or interface change)."""
        self.last_change = time.monotonic()
        self._sent(add, delete)

    def _sent(self, add: Iterable[Flow], delete: Iterable[int]) -> None:
        added = list(add)
        for f in added:
            self.baseline.pop(f.cookie, None)
        if len(added) <= VERIFY_MAX:  # a bulk change is left to the sweep: reading it back would delay the next
            self.verify.update(f.cookie for f in added)
        if self.pending is not None:
            self.pending.touched.update(f.cookie for f in added)
            self.pending.touched.update(delete)

    def step(self, s: Session) -> None:
        """One step, never waiting on the switch: take the answer to what was asked if it came, then ask for the
        next read-back when it is due."""
        p = self.pending
        if p is not None:
            if p.session is not s:
                self.pending = None  # asked on a connection that is gone: the new one starts a sweep
            elif (stats := s.collect(p.xids)) is None:
                if time.monotonic() - p.asked > ANSWER_TIMEOUT:
                    self.pending = None
                    s.forget(p.xids)
                    raise TimeoutError(f"no answer to a read-back in {ANSWER_TIMEOUT:.0f} s")
            else:
                self.pending = None
                if p.n:
                    self._finish(s, p, stats)
                else:
                    take_baselines(stats, self.engine.desired, self.baseline, p.touched)
            if self.pending is not None or p.session is not s:
                return
        now = time.monotonic()  # an answer taken: the next read-back, if due, is asked for at once
        if self.verify and s.swept:
            self.verify.intersection_update(self.engine.desired)  # flows replaced meanwhile need no baseline
            cookies = list(self.verify)[:VERIFY_MAX]
            self.verify.difference_update(cookies)
            self.pending = Pending(s, 0, 0, s.ask_cookies(cookies), now)
            return
        if now < self.next:
            return
        if s.swept and now - self.last_change < self.opts.audit_quiet \
                and now - self.last_chunk < self.opts.audit_max_defer:
            return  # tenants' changes go first; the read-back goes on when they pause
        self.last_chunk = now
        n = n_chunks(len(self.engine.desired))
        i = self.pos % n
        self.pending = Pending(s, i, n, s.ask(i, n), now)

    def _finish(self, s: Session, p: Pending, stats: list) -> None:
        r = audit_chunk(stats, self.engine.desired, self.engine.chunk(p.i, p.n), self.baseline, p.touched)
        if r.add or r.delete:
            s.apply(r.add, r.delete)
            self._sent(r.add, r.delete)  # read back next, for their baselines
            self.state["audit_repairs"] += len(r.add) + len(r.delete)
            if s.swept:
                log.info("audit: restored %d flows (%d edited by hand), removed %d not desired", len(r.add),
                         r.edited, len(r.delete))
        self.state["drops"].update(r.drops)
        took = time.monotonic() - p.asked
        self.pos = p.i + 1
        if self.pos >= p.n:
            self.pos = 0
            self.state["audit_sweeps"] += 1
            if not s.swept:
                s.swept = True
                log.info("switch read back: %d flows desired, %d repaired", len(self.engine.desired),
                         self.state["audit_repairs"])
                self.wake()
        if s.swept:  # paced by what a chunk costs the switch: a walk of all its flows
            total = len(self.engine.desired)
            per_chunk = max(self.opts.audit_interval / p.n, total / self.opts.audit_rate, 3 * took)
            self.next = time.monotonic() + per_chunk
