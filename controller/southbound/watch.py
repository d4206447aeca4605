"""Wake-ups for host watches.

Local writes publish their ChangeSet directly. Writes made by other controller processes arrive through
PostgreSQL LISTEN/NOTIFY, or, on SQLite, by polling the change log (controller/state/change_log.py); a wake without
detail (`unknown=True`: a payload too long for NOTIFY, a revision the log lacks) has every watch recheck.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from controller.auth import REVOKED_CHANNEL
from controller.state import change_log
from controller.state.db import Database
from controller.state.stamps import ChangeSet

log = logging.getLogger(__name__)


@dataclass
class Wake:
    revision: int
    vpcs: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()
    topology: bool = False  # gateway instances' concern; what it changes in hypervisors' configs is stamped apart
    unknown: bool = False
    vteps: bool = False  # the VTEP list every hypervisor holds changed
    ordered: bool = False  # from the database's own order of commits (NOTIFY, the revision poll): see `confirmed`
    traces: frozenset[str] = frozenset()  # hosts with a live trace question for their switch (api/traces.py)
    report: bool = False  # this process asks the host of `hosts` for its report (open_streams.py); never published

    def concerns(self, host: str, relevant: set[str]) -> bool:
        return self.unknown or self.vteps or host in self.hosts or host in self.traces or \
            not relevant.isdisjoint(self.vpcs)


class Subscription:
    """One watch's wakes. A host's watch is indexed by its host and the VPCs its config holds (`keys`), so a write
    wakes the watches it concerns, not all of them; a gateway's (no keys) hears every wake."""

    __slots__ = ("queue", "host", "vpcs")

    def __init__(self, host: str | None) -> None:
        self.queue: asyncio.Queue[Wake] = asyncio.Queue()
        self.host, self.vpcs = host, frozenset[str]()


@dataclass
class Broadcaster:
    db: Database
    loop: asyncio.AbstractEventLoop | None = None
    subs: set[Subscription] = field(default_factory=set)  # every subscription
    every: set[Subscription] = field(default_factory=set)  # those without keys
    by_host: dict[str, set[Subscription]] = field(default_factory=dict)
    by_vpc: dict[str, set[Subscription]] = field(default_factory=dict)
    latest: int = 0
    # every commit up to this revision has been delivered to the watches (its wake is in their queues): the wakes
    # that come in commit order say so as they are delivered (a write of this process is published at once, and
    # may overtake an earlier commit of another process still on its way)
    confirmed: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    recent: deque = field(default_factory=lambda: deque(maxlen=8))  # when the last wakes were delivered
    joins: deque = field(default_factory=lambda: deque(maxlen=4))  # when the last VTEP list changes were
    # PostgreSQL: told when another process revoked credentials, and whether revocations are heard at all (the
    # LISTEN connection is up: while it is not, principals are cached briefly, see controller.auth)
    revoked: Callable[[], None] | None = None
    hearing: Callable[[bool], None] | None = None
    delivered: OrderedDict = field(default_factory=OrderedDict)  # revisions of the last detailed wakes

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.latest = self.db.revision()
        self.db.listeners.append(self._local)
        target = self._listen_pg if self.db.is_postgres else self._poll
        threading.Thread(target=target, name="revision-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def subscribe(self, host: str | None = None) -> Subscription:
        sub = Subscription(host)
        self.subs.add(sub)
        if host is None:
            self.every.add(sub)
        else:
            self.by_host.setdefault(host, set()).add(sub)
        return sub

    def hear_all(self, sub: Subscription) -> None:
        """Every wake reaches `sub` until `keys` is next called: while its watch reads what its config holds, a
        write to a VPC it is about to hold must not pass it by."""
        self.every.add(sub)

    def keys(self, sub: Subscription, vpcs: frozenset[str]) -> None:
        """The VPCs `sub`'s config holds now: the writes to them (and its host) wake it, and no other."""
        self.every.discard(sub)
        for v in sub.vpcs - vpcs:
            if (held := self.by_vpc.get(v)) is not None:
                held.discard(sub)
                if not held:
                    del self.by_vpc[v]
        for v in vpcs - sub.vpcs:
            self.by_vpc.setdefault(v, set()).add(sub)
        sub.vpcs = vpcs

    def unsubscribe(self, sub: Subscription) -> None:
        self.keys(sub, frozenset())
        self.subs.discard(sub)
        self.every.discard(sub)
        if sub.host is not None and (held := self.by_host.get(sub.host)) is not None:
            held.discard(sub)
            if not held:
                del self.by_host[sub.host]

    def concerned(self, w: Wake) -> set[Subscription]:
        """The subscriptions a wake may concern: all for one without detail or a VTEP list change, else those of
        its hosts and VPCs (and those without keys)."""
        if w.unknown or w.vteps:
            return set(self.subs)
        out = set(self.every)
        for h in w.hosts | w.traces:
            out |= self.by_host.get(h, set())
        for v in w.vpcs:
            out |= self.by_vpc.get(v, set())
        return out

    def busy(self, window: float = 0.1, count: int = 3) -> bool:
        """Writes are arriving in a burst: at least `count` wakes in the last `window` seconds."""
        return len(self.recent) >= count and time.monotonic() - self.recent[-count] < window

    def joining(self) -> bool:
        """Hosts are joining in a mass (a cluster booting): four VTEP list changes within the last second."""
        return len(self.joins) == self.joins.maxlen and time.monotonic() - self.joins[0] < 1.0

    async def settle(self, coalesce: float) -> None:
        """In a burst of writes, let more land before compiling (one answer instead of one per write); a lone
        write is answered at once."""
        if coalesce > 0 and self.busy():
            await asyncio.sleep(coalesce)

    def _deliver(self, w: Wake) -> None:
        if w.ordered:
            self.confirmed = max(self.confirmed, w.revision)  # after the wakes before it: they were delivered
        if not w.unknown:
            # a write made here is published at its commit and comes back through NOTIFY: one wake per write
            if w.revision in self.delivered:
                return
            self.delivered[w.revision] = None
            if len(self.delivered) > 1024:
                self.delivered.popitem(last=False)
        self.recent.append(time.monotonic())
        if w.vteps:
            self.joins.append(self.recent[-1])
        self.latest = max(self.latest, w.revision)
        for sub in self.concerned(w):
            sub.queue.put_nowait(w)

    def publish(self, w: Wake) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._deliver, w)

    def _local(self, cs: ChangeSet) -> None:
        self.publish(Wake(cs.revision, frozenset(cs.vpcs), frozenset(cs.hosts), cs.topology, vteps=cs.vteps_moved,
                          traces=frozenset(cs.traces)))

    def _poll(self) -> None:
        """SQLite: the writes of the other processes, from the change log (controller/state/change_log.py), as NOTIFY
        brings them on PostgreSQL; a revision it lacks (let go, or written without it) wakes everyone."""
        seen = self.latest
        while not self._stop.wait(0.1):
            try:
                rev, entries = self.db.changes_after(seen)
            except Exception as e:  # keep watching through transient DB errors
                log.warning("revision poll failed: %s", e)
                continue
            if rev <= seen:
                continue
            logged = {r for r, _ in entries}
            # revisions are consecutive, and every write's is logged (this process's were also published at commit)
            lacking = rev - seen > change_log.KEEP or any(r not in logged and r not in self.delivered
                                                          for r in range(seen + 1, rev + 1))
            for _, p in entries:
                w = parse_notify(p)
                w.ordered = True
                self.publish(w)
            if lacking or not entries or entries[-1][0] < rev:
                self.publish(Wake(rev, unknown=lacking, ordered=True))
            seen = rev

    def _listen_pg(self) -> None:
        import psycopg

        url = self.db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self._stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("LISTEN tianji_revision")
                    conn.execute(f"LISTEN {REVOKED_CHANNEL}")
                    # Anything committed while we were (re)connecting: recheck once, forget every principal once.
                    self._heard(True)
                    self.publish(Wake(self.db.revision(), unknown=True, ordered=True))
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=1.0):
                            if n.channel == REVOKED_CHANNEL:
                                self._heard(True)
                            else:
                                w = parse_notify(n.payload)
                                w.ordered = True
                                self.publish(w)
            except Exception as e:
                self._heard(False)
                log.warning("LISTEN connection lost (%s); reconnecting", e)
                self._stop.wait(1.0)

    def _heard(self, listening: bool) -> None:
        if self.hearing is not None:
            self.hearing(listening)
        if self.revoked is not None:
            self.revoked()


def parse_notify(payload: str) -> Wake:
    try:
        d = json.loads(payload)
        if "v" not in d:
            return Wake(int(d["r"]), unknown=True)
        # a process of an older version sends no "e": its topology then may have moved the VTEP list
        return Wake(int(d["r"]), frozenset(d["v"]), frozenset(d["h"]), bool(d["t"]), vteps=bool(d.get("e", d["t"])),
                    traces=frozenset(d.get("q") or ()))
    except (ValueError, KeyError, TypeError):
        return Wake(0, unknown=True)


async def next_wake(q: asyncio.Queue, deadline: float,
                    relevant: Callable[[Wake], bool | Awaitable[bool]]) -> Wake | None:
    """The long-poll wait every watch shares: the first wake `relevant` accepts, or None at `deadline`
    (monotonic), when the watch answers 304. One timer for the whole wait, not one per wake."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(loop.time() + deadline - time.monotonic()):
            while True:
                w = await q.get()
                ok = relevant(w)
                if inspect.isawaitable(ok):
                    ok = await ok
                if ok:
                    return w
    except TimeoutError:
        return None


@dataclass
class Held:
    """What a watch knows of its watcher's config at one moment: the revision it is at, whether the watcher should
    be answered now (its config changed since what it holds), and what the answer is made from."""

    revision: int
    ready: bool
    value: Any = None


async def long_poll(bc: Broadcaster, coalesce: float, deadline: float, look: Callable[[], Awaitable[Held]],
                    relevant: Callable[[Wake, Held], bool | Awaitable[bool]],
                    woken: Callable[[Wake, Held], Awaitable[Held]] | None = None,
                    host: str | None = None) -> tuple[Held, bool]:
    """The one server-side watch (hosts' and gateway instances'): `look` at the watcher's config; until it is
    ready, wait for a wake that is `relevant` to it (a write that may change it), let a burst of writes settle,
    and look again (or let `woken` say what the wake tells without looking). (what was last seen, whether to
    answer it); False: `deadline` (monotonic) passed first, and the watch answers 304. `host`: a host's watch,
    woken only by writes to it and to the VPCs its config holds (`held.value`)."""
    sub = bc.subscribe(host)  # before the first look, hearing all: a write committed meanwhile still wakes us
    bc.hear_all(sub)

    async def looked(how: Callable[[], Awaitable[Held]] = look) -> Held:
        bc.hear_all(sub)
        got = await how()
        if host is not None:
            bc.keys(sub, frozenset(got.value or ()))
        return got

    try:
        held = await looked()
        while not held.ready:
            w = await next_wake(sub.queue, deadline, lambda w, h=held: relevant(w, h))
            if w is None:
                return held, False
            await bc.settle(coalesce)
            held = await (looked(lambda w=w, h=held: woken(w, h)) if woken is not None else looked())
        return held, True
    finally:
        bc.unsubscribe(sub)
