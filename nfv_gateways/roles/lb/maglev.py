"""Maglev consistent hashing (Eisenbud et al., NSDI 2016), weighted: the Python reference of native/lb_stage.c.

`build(keys, weights, m)` is a pool's lookup table: entry j names the member (an index into `keys`) that new flows
hashing to j go to. It is a deterministic function of the members' keys and weights and of M, the table size (a
prime, at least 100x the members): members are taken in the order of their keys, each walks its own permutation
of the table (offset = h1(key) mod M, skip = h2(key) mod (M - 1) + 1) claiming the next free entry it prefers, and a
member of weight w takes a turn in w/W of the rounds (W: the largest weight; Envoy's weighted Maglev). Weight 0
members get no entry (drained). `native.NativeMaglev` builds the same table in C (tests hold them to identical output).
"""

from __future__ import annotations

import hashlib

from nfv_gateways.core.underlay import mix64
from tianji.primes import is_prime

SEED_OFFSET, SEED_SKIP = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
DEFAULT_M = 65537


def member_key(member_id: str) -> int:
    """A member's 64-bit key, from its id: what orders members and seeds their permutations, the same in every
    instance whatever order the config lists members in."""
    return int.from_bytes(hashlib.blake2b(member_id.encode(), digest_size=8).digest(), "big")


def build(keys: list[int], weights: list[int], m: int = DEFAULT_M) -> list[int]:
    if not is_prime(m):
        raise ValueError(f"Maglev's table size must be a prime, not {m}")
    table = [-1] * m
    live = sorted((k, i, w) for i, (k, w) in enumerate(zip(keys, weights, strict=True)) if w > 0)
    if not live:
        return table
    wmax = max(w for _, _, w in live)
    offset = [mix64(k ^ SEED_OFFSET) % m for k, _, _ in live]
    skip = [mix64(k ^ SEED_SKIP) % (m - 1) + 1 for k, _, _ in live]
    nxt = [0] * len(live)
    target = [0] * len(live)
    filled, rnd = 0, 1
    while filled < m:
        for j, (_, index, w) in enumerate(live):
            if filled >= m:
                break
            if rnd * w < target[j]:
                continue
            target[j] += wmax
            c = (offset[j] + nxt[j] * skip[j]) % m
            while table[c] >= 0:
                nxt[j] += 1
                c = (offset[j] + nxt[j] * skip[j]) % m
            table[c] = index
            nxt[j] += 1
            filled += 1
        rnd += 1
    return table


def flow_hash(src: int, dst: int, sport: int, dport: int, proto: int) -> int:
    """The 5-tuple's hash that indexes a table (mod M), as lb_stage.c computes it."""
    return mix64(((src << 32) | dst) ^ ((sport << 48) | (dport << 32) | (proto << 24)))


__all__ = ["DEFAULT_M", "build", "flow_hash", "member_key"]
