"""The host stream's steps, each alone (controller/southbound/stream_steps.py): what a turn compiles, the events an
answer makes, trace questions once each, how long to wait, and what the wakes ask of the next turn."""

from __future__ import annotations

import json
from types import SimpleNamespace

from controller.southbound import stream_steps as steps
from controller.southbound.stream_steps import StreamState
from controller.southbound.watch import Wake


def delta(revision: int, vpc_ids: list[str] | None = None, vtep_updates: list | None = None) -> SimpleNamespace:
    return SimpleNamespace(revision=revision, vpc_ids=vpc_ids, vtep_updates=vtep_updates or [], vteps_removed=[],
                           model_dump_json=lambda: json.dumps({"revision": revision}))


def test_the_question_carries_what_the_host_holds_and_the_claim() -> None:
    st = StreamState("hv1", 7)
    st.claim = 9
    q = steps.question(st)
    assert (q.host, q.base, q.form, q.sent, q.vteps_only) == ("hv1", 7, "objects", st.sent, 9)
    assert StreamState("hv1", -1, "sections").sent is None  # the sections form keeps no record of what it sent


def test_a_first_answer_is_sent_whole_and_moves_the_host_forward() -> None:
    st = StreamState("hv1", -1)
    events, done = steps.delta_events(st, delta(5))
    assert not done and st.after == 5
    assert events == ['event: delta\nid: 5\ndata: {"revision": 5}\n\n']


def test_an_answer_that_moves_nothing_sends_nothing_unless_it_carries_vtep_entries() -> None:
    st = StreamState("hv1", 5)
    assert steps.delta_events(st, delta(5)) == ([], False)
    events, _ = steps.delta_events(st, delta(5, vtep_updates=["hv9"]))
    assert len(events) == 1 and st.after == 5


def test_a_deleted_host_ends_its_stream() -> None:
    assert steps.delta_events(StreamState("hv1", 5), None) == ([steps.GONE], True)


def test_the_vpcs_held_come_from_what_was_sent_in_the_objects_form() -> None:
    st = StreamState("hv1", -1)
    st.sent.vpc_ids = ["v1", "v2"]
    assert steps.held_vpcs(st, delta(3, vpc_ids=["ignored"])) == {"v1", "v2"}
    assert steps.held_vpcs(StreamState("hv1", -1, "sections"), delta(3, vpc_ids=["v3"])) == {"v3"}


def test_each_trace_question_is_sent_once() -> None:
    st = StreamState("hv1", 1)
    first = steps.trace_events(st, [{"id": "t1"}, {"id": "t2"}])
    assert [json.loads(e.split("data: ")[1]) for e in first] == [{"id": "t1"}, {"id": "t2"}]
    assert steps.trace_events(st, [{"id": "t1"}, {"id": "t3"}]) == ['event: trace\ndata: {"id": "t3"}\n\n']


def test_unconfirmed_wakes_are_looked_at_again_soon() -> None:
    st = StreamState("hv1", 1)
    assert steps.wait_for(st, 5.0) == 5.0
    st.unconfirmed = [Wake(9, vteps=True)]
    assert steps.wait_for(st, 5.0) == steps.RECHECK_S


def test_a_report_wake_asks_for_the_report_and_nothing_else() -> None:
    st = StreamState("hv1", 4)
    assert steps.after_wakes(st, [Wake(0, hosts=frozenset({"hv1"}), report=True)], set(), 10) == [steps.REPORT]
    assert st.asked is False and st.claim == 4  # nothing else woke it: VTEP entries alone, none newer


def test_vtep_wakes_alone_claim_the_newest_confirmed_revision_and_keep_the_rest() -> None:
    st = StreamState("hv1", 4)
    woken = [Wake(6, vteps=True), Wake(8, vteps=True), Wake(12, vteps=True)]
    assert steps.after_wakes(st, woken, {"v1"}, confirmed=10) == []
    assert st.claim == 8  # 12 is past what the commit order confirmed: an older write may still be on its way
    assert [w.revision for w in st.unconfirmed] == [12]


def test_a_wake_of_a_held_vpc_compiles_whole() -> None:
    st = StreamState("hv1", 4)
    steps.after_wakes(st, [Wake(6, vteps=True), Wake(7, vpcs=frozenset({"v1"}))], {"v1"}, confirmed=10)
    assert st.claim is None and st.unconfirmed == []


def test_the_sections_form_never_claims() -> None:
    st = StreamState("hv1", 4, "sections")
    steps.after_wakes(st, [Wake(6, vteps=True)], set(), confirmed=10)
    assert st.claim is None


def test_trace_questions_are_looked_for_when_a_wake_names_this_switch_or_is_unknown() -> None:
    st = StreamState("hv1", 4)
    steps.after_wakes(st, [Wake(6, traces=frozenset({"hv2"}))], set(), 10)
    assert st.asked is False
    steps.after_wakes(st, [Wake(6, traces=frozenset({"hv1"}))], set(), 10)
    assert st.asked is True
    steps.after_wakes(st, [Wake(7, unknown=True)], set(), 10)
    assert st.asked is True
