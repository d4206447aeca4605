"""Placement, as pure functions every controller process computes alike: which gateway instance homes an EIP
(rendezvous hashing) and which instance serves each source-address bucket of a NAT gateway."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence


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


def line_hosts(line_id: str, sessions: int, instances: dict[str, str] | list[str],
               placed: Sequence[str | None] = ()) -> list[str | None]:
    """The instance each of a private line's `sessions` BGP sessions runs on. A session stays where it is placed
    (`placed`, by session) while that instance is live: moving a session takes it down, so a returning instance
    takes nothing back (an operator rebalances). One placed nowhere live goes to the live instance that weighs
    highest for the line and carries no other session of it (the redundant pair on two instances, so that losing
    one leaves a session up); with one instance live, both run on it (None: no instance live)."""
    ranked = sorted(instances, key=lambda i: _weight(f"line:{line_id}", i), reverse=True)
    out = [p if p in instances else None for p in [*placed, *[None] * sessions][:sessions]]
    for k in range(sessions):
        if out[k] is None and ranked:
            free = [i for i in ranked if i not in out]
            out[k] = free[0] if free else ranked[k % len(ranked)]
    return out


def line_sessions(line_id: str, pairs: list[tuple[str, str]], instances: dict[str, str] | list[str],
                  placed: Sequence[str | None] = ()) -> list[tuple[str | None, str, str]]:
    """Each session's (instance, local address, customer address), `pairs` placed by line_hosts."""
    return [(host, local, customer) for host, (local, customer)
            in zip(line_hosts(line_id, len(pairs), instances, placed), pairs, strict=True)]


LINE_BUCKETS = 8  # like NAT_BUCKETS: a VM's source address picks the instance among those a route goes through


def line_buckets(key: str, instances: list[str]) -> list[str]:
    """The instance each source-address bucket of a private-line route goes to (rendezvous per bucket: one
    instance's loss moves only its buckets)."""
    return spread_buckets(key, LINE_BUCKETS, instances) if instances else []
