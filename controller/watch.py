"""Wake-ups for host watches.

Local writes publish their ChangeSet directly. Writes made by other controller processes arrive through
PostgreSQL LISTEN/NOTIFY, or, on SQLite, by polling the revision counter; those may carry no detail
(`ChangeSet.vpcs` is None-like: `unknown=True`), and every watch then rechecks its host's revision.
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
from controller.db import Database
from controller.stamps import ChangeSet

log = logging.getLogger(__name__)


@dataclass
class Wake:
    revision: int
    vpcs: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()
    topology: bool = False  # gateway instances' concern; what it changes in hypervisors' configs is stamped apart
    unknown: bool = False
    vteps: bool = False  # the VTEP list every hypervisor holds changed

    def concerns(self, host: str, relevant: set[str]) -> bool:
        return self.unknown or self.vteps or host in self.hosts or not relevant.isdisjoint(self.vpcs)


@dataclass
class Broadcaster:
    db: Database
    loop: asyncio.AbstractEventLoop | None = None
    queues: set[asyncio.Queue] = field(default_factory=set)
    latest: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    recent: deque = field(default_factory=lambda: deque(maxlen=8))  # when the last wakes were delivered
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

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.queues.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self.queues.discard(q)

    def busy(self, window: float = 0.1, count: int = 3) -> bool:
        """Writes are arriving in a burst: at least `count` wakes in the last `window` seconds."""
        return len(self.recent) >= count and time.monotonic() - self.recent[-count] < window

    async def settle(self, coalesce: float) -> None:
        """In a burst of writes, let more land before compiling (one answer instead of one per write); a lone
        write is answered at once."""
        if coalesce > 0 and self.busy():
            await asyncio.sleep(coalesce)

    def _deliver(self, w: Wake) -> None:
        if not w.unknown:
            # a write made here is published at its commit and comes back through NOTIFY: one wake per write
            if w.revision in self.delivered:
                return
            self.delivered[w.revision] = None
            if len(self.delivered) > 1024:
                self.delivered.popitem(last=False)
        self.recent.append(time.monotonic())
        self.latest = max(self.latest, w.revision)
        for q in list(self.queues):
            q.put_nowait(w)

    def publish(self, w: Wake) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._deliver, w)

    def _local(self, cs: ChangeSet) -> None:
        self.publish(Wake(cs.revision, frozenset(cs.vpcs), frozenset(cs.hosts), cs.topology, vteps=cs.vteps_moved))

    def _poll(self) -> None:
        seen = self.latest
        while not self._stop.wait(0.1):
            try:
                rev = self.db.revision()
            except Exception as e:  # keep watching through transient DB errors
                log.warning("revision poll failed: %s", e)
                continue
            if rev > max(seen, self.latest):
                self.publish(Wake(rev, unknown=True))
            seen = max(seen, rev)

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
                    self.publish(Wake(self.db.revision(), unknown=True))
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=1.0):
                            if n.channel == REVOKED_CHANNEL:
                                self._heard(True)
                            else:
                                self.publish(parse_notify(n.payload))
            except Exception as e:
                self._heard(False)
                log.warning("LISTEN connection lost (%s); reconnecting", e)
                self._stop.wait(1.0)

    def _heard(self, listening: bool) -> None:
        if self.hearing is not None:
            self.hearing(listening)
        if self.revoked is not None:
            self.revoked()


# PostgreSQL's NOTIFY payload must stay under 8,000 bytes: past this, db.STAMP_NOTIFY sends a wake without
# detail ({"r": revision}) and every watch rechecks
NOTIFY_LIMIT = 7900


def parse_notify(payload: str) -> Wake:
    try:
        d = json.loads(payload)
        if "v" not in d:
            return Wake(int(d["r"]), unknown=True)
        # a process of an older version sends no "e": its topology then may have moved the VTEP list
        return Wake(int(d["r"]), frozenset(d["v"]), frozenset(d["h"]), bool(d["t"]), vteps=bool(d.get("e", d["t"])))
    except (ValueError, KeyError, TypeError):
        return Wake(0, unknown=True)


async def next_wake(q: asyncio.Queue, deadline: float,
                    relevant: Callable[[Wake], bool | Awaitable[bool]]) -> Wake | None:
    """The long-poll wait every watch shares: the first wake `relevant` accepts, or None at `deadline`
    (monotonic), when the watch answers 304."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            w = await asyncio.wait_for(q.get(), remaining)
        except TimeoutError:
            continue
        ok = relevant(w)
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return w


@dataclass
class Held:
    """What a watch knows of its watcher's config at one moment: the revision it is at, whether the watcher should
    be answered now (its config changed since what it holds), and what the answer is made from."""

    revision: int
    ready: bool
    value: Any = None


async def long_poll(bc: Broadcaster, coalesce: float, deadline: float, look: Callable[[], Awaitable[Held]],
                    relevant: Callable[[Wake, Held], bool | Awaitable[bool]],
                    woken: Callable[[Wake, Held], Awaitable[Held]] | None = None) -> tuple[Held, bool]:
    """The one server-side watch (hosts' and gateway instances'): `look` at the watcher's config; until it is
    ready, wait for a wake that is `relevant` to it (a write that may change it), let a burst of writes settle,
    and look again (or let `woken` say what the wake tells without looking). (what was last seen, whether to
    answer it); False: `deadline` (monotonic) passed first, and the watch answers 304."""
    q = bc.subscribe()  # before the first look: a write committed meanwhile still wakes us
    try:
        held = await look()
        while not held.ready:
            w = await next_wake(q, deadline, lambda w, h=held: relevant(w, h))
            if w is None:
                return held, False
            await bc.settle(coalesce)
            held = await (woken(w, held) if woken is not None else look())
        return held, True
    finally:
        bc.unsubscribe(q)
