"""How a host's config changes by delta, on both sides: `delta_of` (the controller's whole form), `apply_delta`
(the agent's, and every test's, one definition of how a HostConfigDelta applies), and `changes` (what the
config stream sends of a VPC it sent before: the endpoints and ports that changed, not the VPC's every one)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from tianji.southbound import Endpoint, HostConfig, HostConfigDelta, PortInfo, Vtep


def delta_of(cfg: HostConfig, base: int, changed_vpcs: set[str] | None) -> HostConfigDelta:
    """The delta that takes a config at `base` to `cfg`: the sections of the VPCs in `changed_vpcs`.
    `changed_vpcs` None (the topology moved: VTEPs are in every section) or base -1: everything."""
    whole = base < 0 or changed_vpcs is None
    keep = {v.id for v in cfg.vpcs} if whole else changed_vpcs & {v.id for v in cfg.vpcs}
    return HostConfigDelta.model_construct(  # from a validated config: nothing to validate again
        host=cfg.host, revision=cfg.revision, base=-1 if base < 0 else base, vtep_ip=cfg.vtep_ip, mtu=cfg.mtu,
        vpc_ids=[v.id for v in cfg.vpcs], changed_vpcs=sorted(keep),
        vpcs=[v for v in cfg.vpcs if v.id in keep], endpoints=[e for e in cfg.endpoints if e.vpc_id in keep],
        security_groups=[g for g in cfg.security_groups if g.vpc_id in keep],
        ports=[p for p in cfg.ports if p.vpc_id in keep], vteps=cfg.vteps if whole else None)


def apply_delta(cfg: HostConfig | None, d: HostConfigDelta) -> HostConfig | None:
    """The config a delta leads to from `cfg` (the config at `d.base`; None when there is none yet). None when the
    delta does not apply (another base, or a VPC the agent holds nothing for): the agent then asks for a whole
    config (after=-1). The result equals the whole config the controller compiles at `d.revision`."""
    if d.base < 0:
        cfg = HostConfig(host=d.host, revision=d.base)
    elif cfg is None or cfg.revision != d.base:
        return None
    changed = set(d.changed_vpcs)
    if d.vpc_ids is None:  # the VPCs held (the config stream leaves out an unchanged list)
        d = d.model_copy(update={"vpc_ids": [v.id for v in cfg.vpcs]})
    vpcs = {v.id: v for v in cfg.vpcs if v.id not in changed}
    vpcs.update((v.id, v) for v in d.vpcs)
    if any(v not in vpcs for v in d.vpc_ids):
        return None
    wanted = set(d.vpc_ids)
    endpoints = _endpoints_after(cfg.endpoints_by_vpc(), d, changed)
    if endpoints is None:
        return None
    patched = set(d.patched_vpcs)
    groups = {g.id: g for g in cfg.security_groups if g.vpc_id not in changed or g.vpc_id in patched}
    groups.update((g.id, g) for g in d.security_groups)
    local = _ports_after(cfg.ports, d, changed)
    if local is None:
        return None
    ports = [p for v in sorted(wanted) for p in local[v]]
    used = {g for p in ports for g in p.security_group_ids}
    if not used <= groups.keys():
        return None
    new = HostConfig.model_construct(  # from validated parts: nothing to validate again
        host=d.host, revision=d.revision, vtep_ip=d.vtep_ip, mtu=d.mtu, ports=ports,
        vpcs=[vpcs[v] for v in sorted(wanted)], endpoints=[e for v in sorted(wanted) for e in endpoints[v]],
        security_groups=[groups[g] for g in sorted(used)], vteps=_vteps_after(cfg.vteps, d))
    new._by_vpc.value = endpoints
    return new


def _vteps_after(held: list[Vtep], d: HostConfigDelta) -> list[Vtep]:
    """The VTEP list after `d`: its whole list, or the one held with its entries' changes (in host order); the very
    list held when nothing changed (the agent compares it by identity)."""
    if d.vteps is not None:
        return d.vteps
    if not d.vtep_updates and not d.vteps_removed:
        return held
    by_host = {v.host: v for v in held}
    for name in d.vteps_removed:
        by_host.pop(name, None)
    by_host.update((v.host, v) for v in d.vtep_updates)
    return [by_host[h] for h in sorted(by_host)]




def _ports_after(held: list[PortInfo], d: HostConfigDelta, changed: set[str]) -> dict[str, list[PortInfo]] | None:
    """The host's ports in each VPC after `d`, as `_endpoints_after` has the endpoints (patched: in id order)."""
    patched = set(d.patched_vpcs)
    gone = set(d.ports_removed) | {p.id for p in d.ports if p.vpc_id in patched}
    out: dict[str, list[PortInfo]] = {v: [] for v in d.vpc_ids}
    for p in held:
        if p.vpc_id in out and (p.vpc_id not in changed or p.vpc_id in patched and p.id not in gone):
            out[p.vpc_id].append(p)
    for p in d.ports:
        if p.vpc_id not in out:
            return None  # a port in a VPC the config does not hold
        out[p.vpc_id].append(p)
    for v in patched & out.keys():
        out[v].sort(key=lambda p: p.id)
    return out


def _endpoints_after(held: dict[str, list[Endpoint]], d: HostConfigDelta,
                     changed: set[str]) -> dict[str, list[Endpoint]] | None:
    """Each VPC's endpoints after `d`: held, replaced (a changed VPC), or patched (`d.patched_vpcs`: the held ones
    with the removed and changed taken out, the changed put back, in address order as the controller lists
    them). None: a patch of a VPC not held."""
    patched = set(d.patched_vpcs)
    if not patched <= held.keys():
        return None
    out: dict[str, list[Endpoint]] = {v: [] if v in changed and v not in patched else list(held.get(v, ()))
                                      for v in d.vpc_ids}
    if patched:
        gone = set(d.endpoints_removed) | {e.port_id for e in d.endpoints if e.vpc_id in patched}
        for v in patched & out.keys():
            out[v] = [e for e in out[v] if e.port_id not in gone]
    for e in d.endpoints:
        if e.vpc_id not in out:
            return None
        out[e.vpc_id].append(e)
    for v in patched & out.keys():
        out[v].sort(key=_address)
    return out


def _address(e: Endpoint) -> int:
    return int(ipaddress.IPv4Address(e.ip))


def changes(old: Sequence[Any], new: Sequence[Any], ident: str) -> tuple[list[Any], list[str]]:
    """What takes a VPC's endpoints (`ident` "port_id") or a host's ports in it ("id") from `old` to `new`: those
    that appeared or changed, and the ids of those that went."""
    before = {getattr(x, ident): x for x in old}
    now = {getattr(x, ident) for x in new}
    return [x for x in new if before.get(getattr(x, ident)) != x], [i for i in before if i not in now]
