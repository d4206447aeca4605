"""Placement, as pure functions every controller process computes alike: which gateway instance homes an EIP
(rendezvous hashing) and which instance serves each source-address bucket of a NAT gateway."""

from __future__ import annotations

import hashlib
from collections import Counter


def home(key: str, instances: list[str] | dict[str, str]) -> str | None:
    """Rendezvous (highest random weight) hashing: every controller computes the same home, and when an instance
    dies only what it homed moves; what lives on the survivors stays where it is."""
    if not instances:
        return None
    return max(instances, key=lambda i: _weight(key, i))


def _weight(key: str, instance: str) -> bytes:
    return hashlib.blake2b(f"{key}|{instance}".encode(), digest_size=8).digest()


NAT_BUCKETS = 8  # source-address buckets (the low 3 bits of a VM's address) a NAT gateway's traffic is split into


def nat_buckets(gateway_id: str, eip_ids: list[str], instances: dict[str, str]) -> list[str]:
    """The instance serving each source-address bucket of a NAT gateway's traffic.

    Every EIP is homed on one live instance (rendezvous hashing, like 1:1 EIPs); the instances homing a NAT
    gateway's EIPs serve it, each translating with the EIPs it homes, and the buckets are spread over them, again
    by rendezvous hashing. A VM's address picks its bucket, so all its flows meet one instance and keep one EIP
    (paired pooling, endpoint-independent mapping); when an instance dies, only its EIPs and buckets move."""
    serving = sorted({h for e in eip_ids if (h := home(f"eip:{e}", instances))}) or \
        [h for h in [home(f"natgw:{gateway_id}", instances)] if h]
    if not serving:
        return []
    return spread_buckets(f"natgw:{gateway_id}", NAT_BUCKETS, serving)


def spread_buckets(key: str, count: int, serving: list[str]) -> list[str]:
    """The instance serving each of `count` buckets: rendezvous hashing per bucket, then every serving instance
    takes one (rendezvous alone leaves one of two instances without any of 8 buckets one time in 128, and one of
    three about one time in eight): an instance left without takes, from an instance holding several, the bucket
    it weighs highest for. Only those buckets move."""
    owners = [home(f"{key}:{b}", serving) or "" for b in range(count)]
    for inst in serving:
        held = Counter(owners)
        spare = [b for b in range(count) if held[owners[b]] > 1]
        if inst not in held and spare:
            owners[max(spare, key=lambda b: _weight(f"{key}:{b}", inst))] = inst
    return owners


def line_hosts(line_id: str, sessions: int, instances: dict[str, str] | list[str]) -> list[str | None]:
    """The instance each of a private line's `sessions` BGP sessions runs on: the first on the live private-line
    instance that weighs highest for the line, the second (the redundant pair) on the next one, so that losing one
    instance leaves a session up; with one instance live, both run on it (None: no instance live). An instance's
    loss moves only its sessions (rendezvous order)."""
    ranked = sorted(instances, key=lambda i: _weight(f"line:{line_id}", i), reverse=True)
    return [ranked[k % len(ranked)] if ranked else None for k in range(sessions)]


def line_sessions(line_id: str, pairs: list[tuple[str, str]], instances: dict[str, str] | list[str]) \
        -> list[tuple[str | None, str, str]]:
    """Each session's (instance, local address, customer address), `pairs` placed by line_hosts."""
    return [(host, local, customer)
            for host, (local, customer) in zip(line_hosts(line_id, len(pairs), instances), pairs, strict=True)]


LINE_BUCKETS = 8  # like NAT_BUCKETS: a VM's source address picks the instance among those a route goes through


def line_buckets(key: str, instances: list[str]) -> list[str]:
    """The instance each source-address bucket of a private-line route goes to (rendezvous per bucket: one
    instance's loss moves only its buckets)."""
    return spread_buckets(key, LINE_BUCKETS, instances) if instances else []
