"""A host's config stream as named steps over its memory (`StreamState`), each a plain function of what it is given:
the route (`controller/api/host_stream.py`) only waits and writes, and every decision is here, tested alone
(tests/unit/test_stream_steps.py).

One turn of a stream: `question` (what to compile: the host, the revision it holds, what was sent it, and whether
VTEP entries alone may answer), the compile (batched, `stream_hub.py`), `delta_events` (the events its answer makes,
and whether the stream ends), `trace_events` (live trace questions, each once), then the wait for a wake that
`concerns` the host (keep-alives meanwhile, sooner while `unconfirmed` wakes wait for the commit order), and
`after_wakes` (what the wakes ask: a report, trace questions, a delta of VTEP entries alone at a claimed revision).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from controller.southbound.host_deltas import Asked
from controller.southbound.patches import Sent
from controller.southbound.watch import Wake

RECHECK_S = 0.1  # how soon a VTEP list change not yet confirmed by the commit order is looked at again

GONE = "event: gone\ndata: {}\n\n"
REPORT = "event: report\ndata: {}\n\n"
KEEPALIVE = ": keepalive\n\n"


@dataclass
class StreamState:
    """What one stream remembers between turns."""

    name: str
    after: int  # the revision the host holds (-1: nothing yet, a whole config first)
    form: str = "objects"
    sent: Sent | None = None  # what this stream sent (the objects form: controller/southbound/patches.py)
    claim: int | None = None  # VTEP entries alone answer the next turn, at this revision
    unconfirmed: list[Wake] = field(default_factory=list)  # VTEP wakes newer than the commit order confirmed
    asked: bool = True  # look for trace questions (put before this stream subscribed, or a wake said so)
    told: set[str] = field(default_factory=set)  # each trace question once per stream

    def __post_init__(self) -> None:
        if self.sent is None and self.form == "objects":
            self.sent = Sent()


def question(st: StreamState) -> Asked:
    """What this turn compiles."""
    return Asked(st.name, st.after, st.form, st.sent, st.claim)


def held_vpcs(st: StreamState, d: Any) -> frozenset[str]:
    """The VPCs the host holds after delta `d`: the writes to them wake this stream."""
    return frozenset((st.sent.vpc_ids if st.sent else d.vpc_ids) or ())


def delta_events(st: StreamState, d: Any) -> tuple[list[str], bool]:
    """The events a compiled answer makes, and whether the stream ends (the host was deleted: `d` is None). A
    delta is sent when it moves the host forward, is its first, or carries VTEP entries."""
    if d is None:
        return [GONE], True
    if d.revision > st.after or st.after < 0 or d.vtep_updates or d.vteps_removed:
        st.after = d.revision
        return [f"event: delta\nid: {d.revision}\ndata: {d.model_dump_json()}\n\n"], False
    return [], False


def trace_events(st: StreamState, questions: list[dict]) -> list[str]:
    """The live trace questions this stream has not sent yet (controller/api/traces.py), each once."""
    new = [q for q in questions if q["id"] not in st.told]
    st.told.update(q["id"] for q in new)
    return [f"event: trace\ndata: {json.dumps(q)}\n\n" for q in new]


def wait_for(st: StreamState, keepalive: float) -> float:
    """How long to wait for a wake before a keep-alive line, or before looking at unconfirmed wakes again."""
    return RECHECK_S if st.unconfirmed else keepalive


def after_wakes(st: StreamState, woken: list[Wake], vpcs: set[str], confirmed: int) -> list[str]:
    """What the wakes of this turn ask of the next: a report (held down while streaming: only the host's report
    brings it back), trace questions for this switch, and whether VTEP entries alone answer it (the objects form;
    the sections form answers a whole config to a VTEP list change). `confirmed`: the revision up to which the
    database's commit order has delivered every wake."""
    events = [REPORT] if any(x.report for x in woken) else []
    woken = [x for x in woken if not x.report]
    st.asked = any(st.name in x.traces or x.unknown for x in woken)
    st.claim = vteps_only(st.name, vpcs, woken, st.after, confirmed) if st.sent else None
    st.unconfirmed = [x for x in woken if x.revision > st.claim and x.concerns(st.name, vpcs)] \
        if st.claim is not None else []
    return events


def entries_alone(w: Wake, name: str, vpcs: set[str]) -> bool:
    """`w` changes nothing of `name`'s config but VTEP entries (a host joined, left or moved)."""
    return w.vteps and not w.unknown and name not in w.hosts and vpcs.isdisjoint(w.vpcs)


def vteps_only(name: str, vpcs: set[str], woken: list[Wake], after: int, confirmed: int) -> int | None:
    """A host joining wakes every stream: for one it changes nothing else for (every wake since its last event
    concerns it by the VTEP list alone), the revision its delta of VTEP entries may claim: the newest of those
    wakes the database's order confirms (an older write of another process to one of its VPCs may still be on
    its way); None: compile it whole."""
    concerning = [x for x in woken if x.concerns(name, vpcs)]
    if not all(entries_alone(x, name, vpcs) for x in concerning):
        return None
    return max([after, *(x.revision for x in concerning if x.revision <= confirmed)])
