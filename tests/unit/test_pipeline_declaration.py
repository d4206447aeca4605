"""The pipeline is declared as data and enforced on every flow built: a flow that matches, sets or goes where its
table does not declare is refused when it is built, never sent to a switch."""

from __future__ import annotations

import pytest

from vswitch_agent import pipeline as P
from vswitch_agent.actions import Ct, GotoTable, Load, Output, SetField
from vswitch_agent.flow import flow
from vswitch_agent.flows import goto


def test_declarations_name_real_tables_and_only_go_forward() -> None:
    ids = {t.id for t in P.TABLES}
    for t in P.TABLES:
        assert t.next <= ids, t.name
        assert all(n > t.id for n in t.next), t.name
    with pytest.raises(P.PipelineViolation, match="no loops"):
        P.Table(41, "loop", "-", "-", next=frozenset({40}))


@pytest.mark.parametrize(("table", "match", "actions", "what"), [
    (P.CLASSIFY, {"ipv4_dst": 1}, [goto(P.PORT_SECURITY)], "may not match"),  # classification is by port only
    (P.FORWARD, {"metadata": 1, "eth_type": 0x800, "ipv4_dst": 1}, [goto(P.CLASSIFY)], "may not go to"),
    (P.ROUTING, {"metadata": 1}, [SetField("reg7", 3), goto(P.FORWARD)], "may not set"),  # only FORWARD picks reg7
    (P.PORT_SECURITY, {"in_port": 1}, [Output(2)], "may not output"),  # port security never outputs
    (P.EGRESS_ACL, {"conj_id": 5}, [Ct(True, 1, None, (Load("ct_label", 0, 32, 5),))], "may not set"),
])
def test_a_flow_that_breaks_its_tables_declaration_is_refused(table, match, actions, what) -> None:
    with pytest.raises(P.PipelineViolation, match=what):
        flow(table, 100, match, actions)


def test_a_declared_flow_builds() -> None:
    f = flow(P.FORWARD, 100, {"metadata": 7, "eth_type": 0x800, "ipv4_dst": 1},
             [SetField("eth_dst", "02:00:00:00:00:01"), Load(P.REG_DST_PORT, 0, 32, 3), goto(P.INGRESS_CT)])
    assert f.table == P.FORWARD.id


def test_actions_are_typed_values() -> None:
    """Untyped tuples are refused; typed actions of different kinds never compare equal."""
    with pytest.raises(TypeError, match="vswitch_agent.actions"):
        flow(P.FORWARD, 100, {"metadata": 7}, [("goto", P.INGRESS_CT.id)])
    assert Output(50) != GotoTable(50) and Output(50) == Output(50) and hash(Output(50)) == hash(Output(50))
    assert Load("reg7", 0, 32, 3).nbits == 32 and Ct(True, 1, None).exec_ == ()
