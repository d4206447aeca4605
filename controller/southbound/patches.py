"""What the config stream sends of a VPC it sent before: the endpoints and the host's ports that changed, not the
VPC's every one.

A stream knows what its watcher holds: what it sent. It keeps, per VPC, the endpoints and local ports fragments it
sent last (the compile's own immutable tuples, the endpoints shared by every host of the VPC: references, not
copies), and diffs the new ones against them; every host of the VPC diffs the same two endpoints fragments, so
that diff is made once (`_MEMO`). A VPC the stream has not sent (new to the watcher, or sent before this
connection) goes whole."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tianji.host_delta import changes
from tianji.southbound import Endpoint, HostConfigDelta, PortInfo, SecurityGroupInfo

Fragment = Sequence[Endpoint]
_MEMO: OrderedDict[tuple[int, int], tuple] = OrderedDict()  # (id(old), id(new)) -> (old, new, changed, gone)
_LOCK = threading.Lock()
MEMO_SIZE = 4096


def _changes(old: Sequence, new: Sequence, ident: str) -> tuple[list, list[str]]:
    key = (id(old), id(new))
    with _LOCK:
        hit = _MEMO.get(key)
        if hit is not None and hit[0] is old and hit[1] is new:  # the objects, kept alive here: ids not reused
            _MEMO.move_to_end(key)
            return hit[2], hit[3]
    changed, removed = changes(old, new, ident)
    with _LOCK:
        _MEMO[key] = (old, new, changed, removed)
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    return changed, removed


@dataclass
class Sent:
    """What a config stream sent: per VPC its endpoints, the host's ports and their groups (id -> group), and
    the list of the config's VPCs."""

    vpcs: dict[str, tuple[Fragment, Sequence[PortInfo], dict[str, SecurityGroupInfo]]] = field(default_factory=dict)
    vpc_ids: list[str] | None = None
    vtep_ip: str | None = None  # the host's own, as last sent


def _groups_by_vpc(d: HostConfigDelta) -> dict[str, dict[str, SecurityGroupInfo]]:
    out: dict[str, dict[str, SecurityGroupInfo]] = {}
    for g in d.security_groups:
        out.setdefault(g.vpc_id, {})[g.id] = g
    return out


def patch(d: HostConfigDelta, endpoints: dict[str, Fragment], local: dict[str, Sequence[PortInfo]],
          sent: Sent) -> HostConfigDelta:
    """`d` with the endpoints, ports and groups of the VPCs `sent` holds as changes (`patched_vpcs`), and without
    its list of VPCs when it is the one sent; `sent` then holds what the watcher does after `d`."""
    groups = _groups_by_vpc(d)
    sent.vtep_ip = d.vtep_ip
    if d.base < 0 or d.vteps is not None:  # a whole config: the watcher replaces everything
        sent.vpcs = {vid: (endpoints[vid], local.get(vid, ()), groups.get(vid, {})) for vid in d.changed_vpcs}
        sent.vpc_ids = d.vpc_ids
        return d
    eps: list[Endpoint] = []
    ports: list[PortInfo] = []
    kept: list[SecurityGroupInfo] = []
    patched: list[str] = []
    eps_gone: list[str] = []
    ports_gone: list[str] = []
    for vid in d.changed_vpcs:
        new = (endpoints[vid], local.get(vid, ()), groups.get(vid, {}))
        old = sent.vpcs.get(vid)
        if old is None:
            eps += new[0]
            ports += new[1]
            kept += new[2].values()
        else:
            changed, gone = _changes(old[0], new[0], "port_id")
            eps += changed
            eps_gone += gone
            changed, gone = _changes(old[1], new[1], "id")
            ports += changed
            ports_gone += gone
            kept += [g for gid, g in new[2].items() if old[2].get(gid) != g]  # the unused go on their own
            patched.append(vid)
        sent.vpcs[vid] = new
    for vid in sent.vpcs.keys() - set(d.vpc_ids):
        del sent.vpcs[vid]
    same_vpcs = d.vpc_ids == sent.vpc_ids
    sent.vpc_ids = d.vpc_ids
    if not patched and not same_vpcs:
        return d
    return d.model_copy(update={"endpoints": eps, "ports": ports, "security_groups": kept,
                                "patched_vpcs": patched, "endpoints_removed": eps_gone, "ports_removed": ports_gone,
                                "vpc_ids": None if same_vpcs else d.vpc_ids})
