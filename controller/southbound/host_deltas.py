"""What changed in hosts' configs after the revisions they hold: the watches' answers (HostConfigDelta), compiled
for many hosts at once from one snapshot (a batch of woken streams: controller/southbound/stream_hub.py) or for one."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from controller.southbound.compiler import Compiled, compile_hosts
from controller.southbound.patches import Sent, patch
from controller.state.reads import Q_REMOVED_AFTER, Q_VTEPS_AFTER, Reads, host_views
from tianji.host_delta import delta_of
from tianji.southbound import HostConfigDelta, Vtep


@dataclass
class Asked:
    """One watcher's question: its host, the revision it holds, the form, and (a stream) what was sent it."""

    host: str
    base: int
    form: str = "sections"
    sent: Sent | None = None
    # a stream woken only by VTEP list changes since `base` (form objects): its delta is those entries alone, at
    # this revision (controller/api/host_stream.py says which it may claim)
    vteps_only: int | None = None


def compile_host_delta(s: Session, host: str, base: int, form: str = "sections",
                       sent: Sent | None = None) -> HostConfigDelta | None:
    return compile_host_deltas(s, [Asked(host, base, form, sent)])[0]


def compile_host_deltas(s: Session, asked: list[Asked]) -> list[HostConfigDelta | None]:
    """What changed in each host's config after its `base` (see HostConfigDelta; None: the host is not
    registered): the sections of the VPCs stamped after it (their endpoints, groups, and the host's ports in them);
    with `form` "sections" everything when the topology moved, with "objects" the VTEP entries that changed
    (whatever else a topology change changes in the config stamped its VPCs: stamps.py). `sent`: the config
    stream's record of what it sent per VPC, which then goes as changes (controller/southbound/patches.py).

    A VPC that became relevant after `base` is among the changed ones: it became the host's own by a port write
    that stamped it, or a peer by a peering write that stamped it, or the peer of a VPC that became the host's
    own, which is why a stamped host also gets the peers of its stamped VPCs. Three round trips for the batch:
    the views, the missing fragments, the VTEP entries."""
    views = host_views(s, sorted({a.host for a in asked if a.vteps_only is None}))
    compiled = compile_hosts(s, {h: v for h, v in views.items() if v is not None})
    out = [_entries_only(a) if a.vteps_only is not None else _delta(compiled[a.host], a)
           if a.host in compiled else None for a in asked]
    wanting = [i for i, (a, d) in enumerate(zip(asked, out, strict=True)) if a.vteps_only is not None
               or d is not None and d.vteps is None and compiled[a.host].vteps_stamp > a.base]
    if wanting:
        floor = min(asked[i].base for i in wanting)
        reads = Reads()
        reads.add("updates", Q_VTEPS_AFTER, base=floor)
        reads.add("removed", Q_REMOVED_AFTER, base=floor)
        got = reads.run(s)
        # built once for the batch (a thousand streams told of one host joining share its entry), and once per base
        updates = [(r, Vtep.model_construct(host=n, ip=ip, kind=k)) for n, ip, k, r in got["updates"]]
        # an entries-only delta holds the entries up to the revision it claims: the newer ones (their wakes not yet
        # confirmed by the commit order) come with the next, not twice
        by_base: dict[tuple[int, int | None], dict] = {}
        for i in wanting:
            key, d = (asked[i].base, asked[i].vteps_only), out[i]
            assert d is not None
            if key not in by_base:
                base, upto = key[0], key[1] if key[1] is not None else 1 << 62
                by_base[key] = {"vtep_updates": [v for r, v in updates if base < r <= upto],
                                "vteps_removed": [n for n, r in got["removed"] if base < r <= upto]}
            out[i] = d.model_copy(update=by_base[key])
    return out


def _entries_only(a: Asked) -> HostConfigDelta:
    assert a.sent is not None and a.vteps_only is not None
    return HostConfigDelta.model_construct(host=a.host, revision=a.vteps_only, base=a.base, vtep_ip=a.sent.vtep_ip,
                                           vpc_ids=None)


def _delta(c: Compiled, a: Asked) -> HostConfigDelta:
    base = a.base
    whole = base < 0 or a.form != "objects" and max(c.topology, c.vteps_stamp) > base
    changed = None if whole else {vid for vid, rev in c.vpc_revisions.items() if rev > base}
    if changed is not None and c.host_stamp > base:
        changed |= {peer for vid in c.own & changed for _, peer in c.peers.get(vid, ())}
    d = delta_of(c.config, base, None) if changed is None else c.delta(base, changed)
    return d if a.sent is None else patch(d, c.endpoints, c.local, a.sent)
