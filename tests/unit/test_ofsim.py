"""The test switch runs what the agent would send (bytes parsed back by os-ken) and refuses ambiguous tables."""

from __future__ import annotations

import pytest

from vswitch_agent import pipeline as P
from vswitch_agent.actions import Conjunction, Output
from vswitch_agent.flow import flow
from vswitch_agent.flows import base_flows, goto
from vswitch_agent.ofmodel import OverlapError, Switch, WireFlow

IP = {"metadata": 7, "eth_type": 0x800}


def test_two_flows_of_one_priority_that_can_match_one_packet_are_refused() -> None:
    a = flow(P.FORWARD, 100, IP | {"ipv4_dst": ("10.0.0.0", "255.255.0.0")}, [Output(1)])
    b = flow(P.FORWARD, 100, IP | {"ipv4_dst": "10.0.3.4"}, [Output(2)])
    with pytest.raises(OverlapError, match="overlap"):
        Switch({a, b})


def test_disjoint_flows_conjunction_clauses_and_identical_behaviour_are_accepted() -> None:
    a = flow(P.FORWARD, 100, IP | {"ipv4_dst": ("10.0.0.0", "255.255.0.0")}, [Output(1)])
    b = flow(P.FORWARD, 100, IP | {"ipv4_dst": "10.1.3.4"}, [Output(2)])
    c = flow(P.FORWARD, 100, {"metadata": 8, "eth_type": 0x800}, [Output(2)])
    clause1 = flow(P.EGRESS_ACL, 100, {"in_port": 3}, [Conjunction(5, 1, 2)])
    clause2 = flow(P.EGRESS_ACL, 100, IP | {"ipv4_dst": "10.0.0.9"}, [Conjunction(5, 2, 2)])
    same1 = flow(P.EGRESS_ACL_LABEL, 100, {"ct_label": (0, 0xFFFF)}, [goto(P.LB_UNNAT)])
    same2 = flow(P.EGRESS_ACL_LABEL, 100, {"ct_label": (0, 0xFF)}, [goto(P.LB_UNNAT)])
    sw = Switch({a, b, c, clause1, clause2, same1, same2, *base_flows()})
    assert len(sw.tables[P.FORWARD.id]) == 4  # three flows and the table's drop


def test_the_model_runs_the_parsed_wire_form() -> None:
    f = flow(P.FORWARD, 100, IP | {"ipv4_dst": "10.0.3.4"}, [Output(2)])
    w = WireFlow.of(f)
    assert (w.table, w.priority, w.cookie) == (P.FORWARD.id, 100, f.cookie)
    assert dict(w.match)["ipv4_dst"] == "10.0.3.4" and w.actions[0].port == 2
