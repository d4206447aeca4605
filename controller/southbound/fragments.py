"""The compiled-fragment cache: a VPC's endpoints, subnets, groups and a host's ports in it, each compiled once per
version (the stamps it follows) and shared by every host and every compile that needs it (see compiler.py)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any

from sqlalchemy.orm import Session


class FragmentCache:
    """Immutable compiled fragments, one version per key: a VPC's endpoints as of its revision, a host's ports in a
    VPC as of that VPC's revision, and so on (thread-safe: the watch API compiles in a thread pool). A newer version
    replaces the older one, which no new snapshot needs again: the cache holds what the current state needs, not
    every revision it went through (keeping those made the heap, and every full garbage collection, grow with the
    write history). A bounded LRU over keys all the same, whose entries unused for `idle_s` go: a deleted VPC's
    fragments are never asked for again, and under tenants' churn they were most of the controller's growth (five
    entries per VPC with one host, more per host and gateway, kept until the LRU's bound)."""

    def __init__(self, size: int, idle_s: float = 300.0) -> None:
        self.size, self.idle_s = size, idle_s
        self.data: OrderedDict[tuple, tuple] = OrderedDict()  # in the order of their last use
        self.used: dict[tuple, float] = {}
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _scoped(bind: object, key: tuple) -> tuple:
        # one cache per database: host names and revisions repeat across databases (tests run many). The engine
        # object is the scope, hashed by identity: its URL renders itself to a string on every hash, which was a
        # quarter of a compile's time on these per-VPC lookups
        return (bind, *key)

    def get(self, s: Session, key: tuple, version: tuple | int) -> tuple | None:
        return self.get_many(s, {key: version}).get(key)

    def get_many(self, s: Session, wanted: dict[tuple, tuple | int]) -> dict[tuple, tuple]:
        """The fragments held at these versions (key -> version), under one lock: those missing are absent."""
        bind, out, now = s.get_bind(), {}, time.monotonic()
        with self.lock:
            for key, version in wanted.items():
                v = self.data.get(scoped := self._scoped(bind, key))
                if v is not None and v[0] == version:
                    self.data.move_to_end(scoped)
                    self.used[scoped] = now
                    out[key] = v[1]
            self.hits += len(out)
            self.misses += len(wanted) - len(out)
        return out

    def put(self, s: Session, key: tuple, version: tuple | int, value: tuple) -> None:
        key = self._scoped(s.get_bind(), key)
        with self.lock:
            old = self.data.get(key)
            if old is not None and _newer(old[0], version):
                return  # a snapshot older than the cached fragment's: keep the newer one
            self.data[key] = (version, value)
            self.data.move_to_end(key)
            now = self.used[key] = time.monotonic()
            while True:  # the least recently used first: over the bound, or idle too long
                oldest = next(iter(self.data))
                if len(self.data) <= self.size and self.used[oldest] >= now - self.idle_s:
                    break
                del self.data[oldest], self.used[oldest]

    def clear(self) -> None:
        with self.lock:
            self.data.clear()
            self.used.clear()


def _newer(a: tuple | int, b: tuple | int) -> bool:
    """Versions are revisions (or tuples of them) that only grow."""
    return a > b if isinstance(a, int) else all(x >= y for x, y in zip(a, b, strict=True)) and a != b


FRAGMENTS = FragmentCache(50_000)  # one entry per VPC (a few kinds) and per host


def cached(s: Session, kind: str, vpcs: dict[str, tuple | int]) -> tuple[dict, list[str]]:
    """The cached `kind` fragments of these VPCs (id -> version), and the VPCs that have none of that version."""
    got = FRAGMENTS.get_many(s, {(kind, vid): version for vid, version in vpcs.items()})
    return {key[1]: frag[0] for key, frag in got.items()}, [vid for vid in vpcs if (kind, vid) not in got]


def store(s: Session, kind: str, versions: dict[str, tuple | int], built: dict[str, Any], into: dict) -> None:
    """Fragments just built for these VPCs: into the compile's parts and into FRAGMENTS, at the versions they were
    found missing at (see cached)."""
    for vid, frag in built.items():
        into[vid] = frag
        FRAGMENTS.put(s, (kind, vid), versions[vid], (frag,))


def digest_of(text_: str) -> str:
    """The digest of a compiled section's JSON (what gateway configs are compared by)."""
    return hashlib.sha256(text_.encode()).hexdigest()[:32]
