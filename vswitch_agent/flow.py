"""One flow: the immutable value the agent installs, its cookie, and `flow()`, the one builder of flows, which
checks every flow against its table's declaration (pipeline.Table.verify_once) and shares equal parts."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from vswitch_agent import pipeline as P
from vswitch_agent.actions import Action, Conjunction


class Flow:
    """One OpenFlow entry. Immutable; equal flows have equal cookies. Compact (`__slots__`, shared tuples): a host
    holds 100,000s. The object a flow comes from is kept only as the cookie's middle bits."""

    __slots__ = ("table", "priority", "match", "actions", "cookie", "_hash")

    def __init__(self, table: int, priority: int, match: tuple[tuple[str, Any], ...], actions: tuple[Action, ...],
                 kind: str = "base", obj: str | int = "") -> None:
        set_ = object.__setattr__
        set_(self, "table", table)
        set_(self, "priority", priority)
        set_(self, "match", match)
        set_(self, "actions", actions)  # empty: drop
        key = (table, priority, match, actions)
        h = hashlib.blake2b(repr(key).encode(), digest_size=4).digest()
        o = obj if isinstance(obj, int) else object_hash(obj)
        set_(self, "cookie", (P.COOKIE_KINDS[kind] << 56) | (o << 32) | int.from_bytes(h))
        set_(self, "_hash", hash(key))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Flow is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Flow) and self.cookie == other.cookie and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    @property
    def key(self) -> tuple:
        return (self.table, self.priority, self.match, self.actions)

    @property
    def kind(self) -> str:
        return KIND_NAMES[self.cookie >> 56]

    @property
    def obj_hash(self) -> int:
        return (self.cookie >> 32) & 0xFFFFFF

    @property
    def conjunctive(self) -> bool:
        """A clause of a conjunction: actions are conjunctions only, merged with equal matches of other objects."""
        return bool(self.actions) and all(type(a) is Conjunction for a in self.actions)

    def m(self) -> dict[str, Any]:
        return dict(self.match)

    def __repr__(self) -> str:
        match = ",".join(f"{k}={v}" for k, v in self.match)
        return f"table={self.table} priority={self.priority} {match} actions={list(self.actions) or 'drop'}"

    __str__ = __repr__


KIND_NAMES = {v: k for k, v in P.COOKIE_KINDS.items()}


def object_hash(obj: str) -> int:
    """The cookie's middle 24 bits: which object a flow comes from."""
    return int.from_bytes(hashlib.blake2b(obj.encode(), digest_size=3).digest())


_shared: dict[Any, Any] = {}
PRUNE_FLOOR = 1 << 16  # entries: the table is swept when it grows past this, or past twice what a sweep kept
_prune_at = PRUNE_FLOOR
UNUSED_REFS = 5  # the table's key and value (one object), the sweep's list and loop variable, getrefcount's argument


def shared(x: Any) -> Any:
    """One copy of an equal match pair or action for every flow that uses it (the same VNI, router MAC or ARP
    rewrite appears in thousands of flows). Copies no flow holds any more go at the next sweep: every MAC, address
    and port number a host ever saw stayed otherwise, and under tenants' churn the agent grew with them."""
    global _prune_at
    got = _shared.setdefault(x, x)
    if len(_shared) > _prune_at:
        sweep()
        _prune_at = max(PRUNE_FLOOR, 2 * len(_shared))
    return got


def sweep() -> int:
    """Forget the shared copies only this table holds; how many went. Safe beside another thread's `shared`: a copy
    it is about to use is referenced by it, and one forgotten meanwhile is only no longer shared."""
    dead = [v for v in list(_shared.values()) if sys.getrefcount(v) <= UNUSED_REFS]
    for v in dead:
        _shared.pop(v, None)
    return len(dead)


def flow(table: P.Table, priority: int, match: Mapping[str, Any], actions: Iterable[Action] = (),
         kind: str = "base", obj: str = "") -> Flow:
    """The one builder of flows: every flow is checked against its table's declaration (Table.verify_once)."""
    acts = tuple(actions)
    if not all(isinstance(a, Action) for a in acts):  # before sharing: a plain tuple equals its typed twin
        raise TypeError(f"actions are vswitch_agent.actions objects, not {acts!r}")
    acts = tuple(shared(a) for a in acts)
    pairs = tuple(shared(kv) for kv in sorted(match.items()))
    table.verify_once(tuple(k for k, _ in pairs), acts)
    return Flow(table.id, priority, pairs, acts, kind, obj)
