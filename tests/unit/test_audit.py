"""The audit asks for a chunk and does not wait on it: changes go out meanwhile, and what the chunk read of the
flows those changes touched is already old, so it repairs none of them (vswitch_agent/audit.py)."""

from __future__ import annotations

import pytest

from vswitch_agent import audit as A
from vswitch_agent.audit import Audit
from vswitch_agent.engine import FlowEngine
from vswitch_agent.flow import Flow
from vswitch_agent.host import AgentOptions
from vswitch_agent.openflow import RawFlowStats
from vswitch_agent.switch import audit_chunk


def stat(f: Flow) -> RawFlowStats:
    s = RawFlowStats()
    s.table_id, s.priority, s.cookie, s.packet_count, s.content = f.table, f.priority, f.cookie, 0, repr(f).encode()
    return s


def flow(i: int) -> Flow:
    return Flow(50, 100, (("eth_type", 0x0800), ("ipv4_dst", f"10.0.0.{i}")), (("output", i),))


class FakeSession:
    """Answers chunk requests only when told to, from a snapshot taken when asked (as the switch's walk does)."""

    def __init__(self, installed: dict[int, Flow]) -> None:
        self.installed = installed
        self.swept = True
        self.asked: list[list[RawFlowStats]] = []
        self.released = False
        self.applied: list[tuple[list[Flow], list[int]]] = []

    def ask(self, i: int, n: int) -> list[int]:
        self.asked.append([stat(f) for c, f in self.installed.items() if c & (n - 1) == i])
        return [len(self.asked)]

    def collect(self, xids: list[int]) -> list | None:
        return self.asked[xids[0] - 1] if self.released else None

    def ask_cookies(self, cookies: list[int]) -> list[int]:
        self.asked.append([stat(self.installed[c]) for c in cookies if c in self.installed])
        return [len(self.asked)]

    def apply(self, add: list[Flow], delete: list[int]) -> list[str]:
        self.applied.append((add, delete))
        for f in add:
            self.installed[f.cookie] = f
        for c in delete:
            self.installed.pop(c, None)
        return []


def test_changed_cookies_are_left_alone() -> None:
    a, b, c = flow(1), flow(2), flow(3)
    stale = [stat(a), stat(c)]  # read before a change deleted a and added b
    desired = {b.cookie: b, c.cookie: c}
    r = audit_chunk(stale, desired, [b.cookie, c.cookie], {}, {a.cookie, b.cookie})
    assert r.add == [] and r.delete == []
    r = audit_chunk(stale, desired, [b.cookie, c.cookie], {})  # the same read taken as current: wrong repairs
    assert r.add == [b] and r.delete == [a.cookie]


def test_a_change_goes_out_while_a_chunk_is_pending_and_is_not_undone() -> None:
    engine = FlowEngine()
    sw = FakeSession(dict(engine.desired))
    state = {"audit_repairs": 0, "audit_sweeps": 0, "drops": {}}
    wakes: list[int] = []
    audit = Audit(AgentOptions("h", "c", "t", "172.31.0.1/24", "ul0", audit_quiet=0, audit_interval=0, audit_rate=1e12),
                  engine, state, lambda: wakes.append(1))
    audit.step(sw)  # type: ignore[arg-type]
    assert audit.pending is not None and len(sw.asked) == 1
    audit.step(sw)  # type: ignore[arg-type]  # no answer yet: it returns at once, without asking again
    assert len(sw.asked) == 1
    # a change while the chunk is pending: one flow added, one removed
    new = flow(9)
    gone = next(iter(engine.desired.values()))
    del engine.desired[gone.cookie]
    engine.desired[new.cookie] = new
    sw.apply([new], [gone.cookie])
    audit.changed([new], [gone.cookie])
    sw.released = True
    audit.step(sw)  # type: ignore[arg-type]
    assert sw.applied == [([new], [gone.cookie])]  # the audit repaired nothing: the stale read did not count
    assert sw.installed.keys() == engine.desired.keys()
    # and in the same step, the flow just installed is asked for by cookie (its baseline), again not waited on
    assert audit.pending is not None and audit.pending.n == 0 and [s.cookie for s in sw.asked[-1]] == [new.cookie]
    audit.step(sw)  # type: ignore[arg-type]
    assert new.cookie in audit.baseline


def test_a_read_back_never_answered_is_given_up_and_reported() -> None:
    engine = FlowEngine()
    sw = FakeSession(dict(engine.desired))
    sw.forget = lambda xids: None  # type: ignore[attr-defined]
    audit = Audit(AgentOptions("h", "c", "t", "172.31.0.1/24", "ul0"), engine,
                  {"audit_repairs": 0, "audit_sweeps": 0, "drops": {}}, lambda: None)
    audit.step(sw)  # type: ignore[arg-type]
    assert audit.pending is not None
    audit.pending.asked -= A.ANSWER_TIMEOUT + 1
    with pytest.raises(TimeoutError):
        audit.step(sw)  # type: ignore[arg-type]
    assert audit.pending is None
    audit.step(sw)  # type: ignore[arg-type]  # and the sweep asks again
    assert audit.pending is not None and len(sw.asked) == 2
