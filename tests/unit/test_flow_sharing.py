"""Flows share equal match pairs and actions (vswitch_agent/flow.py `shared`); a copy no flow holds any more is
forgotten by the next sweep, so a host's churn of MACs, addresses and ports does not grow the agent for ever."""

from __future__ import annotations

import gc

from vswitch_agent import flow as F
from vswitch_agent import pipeline as P
from vswitch_agent.actions import GotoTable


def _port_flow(i: int) -> F.Flow:
    mac = f"fa:16:3e:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}"
    return F.flow(P.PORT_SECURITY, 100, {"in_port": 5000 + i, "eth_src": mac, "eth_type": 0x0800,
                                         "ipv4_src": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"},
                  [GotoTable(P.EGRESS_CT.id)], "port", f"p{i}")


def test_copies_no_flow_holds_are_forgotten_and_those_in_use_stay_shared() -> None:
    F.sweep()
    base = len(F._shared)
    kept = [_port_flow(i) for i in range(100)]
    gone = [_port_flow(i) for i in range(100, 1100)]
    assert len(F._shared) >= base + 1100 * 3  # in_port, eth_src, ipv4_src of each
    del gone
    gc.collect()
    assert F.sweep() >= 1000 * 3
    assert len(F._shared) <= base + 100 * 3 + 2  # the kept flows' own, and the shared eth_type and goto
    again = _port_flow(7)
    assert again == kept[7]
    assert all(a is b for a, b in zip(again.match, kept[7].match, strict=True))  # still one copy
    assert again.actions[0] is kept[0].actions[0]


def test_the_table_is_swept_as_it_grows(monkeypatch) -> None:
    F.sweep()
    base = len(F._shared)
    floor = 2 * base + 300  # above twice what a sweep keeps, whatever earlier tests left alive
    monkeypatch.setattr(F, "PRUNE_FLOOR", floor)
    monkeypatch.setattr(F, "_prune_at", floor)
    for i in range(20_000, 30_000):  # flows made and dropped, as a churning host's are: 30,000 copies in all
        _port_flow(i)
        assert len(F._shared) <= floor + 5
