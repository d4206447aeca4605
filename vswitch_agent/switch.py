"""One OpenFlow connection to br-int: changes sent in bundles, and the audit that reads the switch back.

A `Session` lives as long as one connection. Everything it sends is bytes (`openflow`), concatenated into large
writes. A change is one ONF bundle (atomic) followed by a barrier; its reply is what says the switch holds it.
The audit reads the flows back in chunks (flows whose cookie's low bits equal the chunk number), compares each
chunk with the desired flows, and repairs it: flows missing (a restarted ovs-vswitchd has none), flows that are not
desired (left by an older agent), flows edited by hand (their bytes differ from what was first read back). The
first sweep after a connect runs at full speed; later sweeps are rate-limited.

os-ken runs on native threads: the agent's program thread sends and waits here, os-ken's event thread delivers the
replies (`on_*`), and a condition joins the two. A session whose connection went away (`end`) fails every wait at
once, so a pass in progress stops instead of sending into a dead socket.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vswitch_agent import openflow
from vswitch_agent.engine import BUCKETS
from vswitch_agent.flow import Flow

log = logging.getLogger("tianji.agent")

BUNDLE_MAX = 20_000  # flow mods per bundle: a bulk load goes in several atomic steps, bounding the switch's memory
WRITE_CHUNK = 256 * 1024  # bytes per socket write
CHUNK_FLOWS = 4_000  # about this many flows per audit chunk: each chunk costs the switch a walk of all its flows
VERIFY_MAX = 256  # flows read back one by one after a change (by exact cookie: the switch looks them up)


class SwitchGone(Exception):
    """The connection this session served is gone (or a newer one replaced it)."""


@dataclass
class Session:
    dp: Any
    alive: bool = True
    swept: bool = False  # a whole audit sweep has completed on this connection
    replies: dict[int, list] = field(default_factory=dict)  # xid -> stats bodies (barriers: [])
    done: set[int] = field(default_factory=set)
    errors: dict[int, str] = field(default_factory=dict)
    _xid: Any = field(default_factory=lambda: itertools.count(0x80000000))
    _cond: threading.Condition = field(default_factory=threading.Condition)
    on_answer: Callable[[], None] | None = None  # a flow-stats answer is complete (wakes the program loop)

    def xid(self) -> int:
        return next(self._xid) & 0xFFFFFFFF

    def end(self) -> None:
        """The connection is gone (or replaced): every wait fails now."""
        with self._cond:
            self.alive = False
            self._cond.notify_all()

    # --- sending ----------------------------------------------------------------------------------------------
    def _write(self, msgs: Iterable[bytes]) -> None:
        buf: list[bytes] = []
        size = 0
        for m in msgs:
            buf.append(m)
            size += len(m)
            if size >= WRITE_CHUNK:
                self._send(b"".join(buf))
                buf, size = [], 0
        if buf:
            self._send(b"".join(buf))

    def _send(self, data: bytes) -> None:
        if not self.alive:
            raise SwitchGone
        self.dp.send(data)  # blocks while os-ken's send queue is full, which paces us

    def _wait(self, xid: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while xid not in self.done:
                if not self.alive:
                    raise SwitchGone
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply to xid {xid:#x} in {timeout} s")
                self._cond.wait(left)
            self.done.discard(xid)

    def apply(self, add: list[Flow], delete: list[int], timeout: float = 60) -> list[str]:
        """Adds, then deletes (a changed flow replaces its predecessor without a gap), in bundles of at most
        BUNDLE_MAX, each committed atomically. A bundle the switch refuses is sent again message by message so
        that one bad flow costs only itself. Returns the switch's error messages."""
        msgs = [(openflow.flow_add_bytes, f) for f in add] + [(openflow.flow_delete_bytes, c) for c in delete]
        problems: list[str] = []
        for i in range(0, len(msgs), BUNDLE_MAX):
            part = msgs[i:i + BUNDLE_MAX]
            first = self.xid()
            bid = first & 0x7FFFFFFF
            out = [openflow.bundle_ctrl_bytes(bid, 0, first)]  # ONF_BCT_OPEN_REQUEST
            for enc, obj in part:
                x = self.xid()
                out.append(openflow.bundle_add_bytes(bid, enc(obj, x), x))
            commit = self.xid()
            out.append(openflow.bundle_ctrl_bytes(bid, 4, commit))  # ONF_BCT_COMMIT_REQUEST
            barrier = self.xid()
            out.append(openflow.barrier_bytes(barrier))
            self._write(out)
            self._wait(barrier, timeout)
            failed = {x: e for x, e in self.errors.items() if first <= x <= commit}
            if failed:
                for x in failed:
                    del self.errors[x]
                log.warning("the switch refused bundle %#x (%s); sending its %d changes one by one", bid,
                            next(iter(failed.values())), len(part))
                problems += self._apply_unbundled(part, timeout)
        return problems

    def _apply_unbundled(self, part: list, timeout: float) -> list[str]:
        xids, out = {}, []
        for enc, obj in part:
            x = self.xid()
            xids[x] = obj
            out.append(enc(obj, x))
        barrier = self.xid()
        out.append(openflow.barrier_bytes(barrier))
        self._write(out)
        self._wait(barrier, timeout)
        problems = []
        for x in [x for x in self.errors if x in xids]:
            problems.append(f"{self.errors.pop(x)}: {xids[x]}")
        return problems

    # --- reading back -----------------------------------------------------------------------------------------
    def ask(self, chunk: int, n_chunks: int) -> list[int]:
        """Ask for the installed flows of one chunk (cookie & (n_chunks - 1) == chunk) without waiting: the
        answer is `collect`ed later, and `on_answer` runs when it is complete."""
        return self._ask([(chunk, n_chunks - 1)])

    def collect(self, xids: list[int]) -> list | None:
        """The flows answered to `ask`, once every reply is in; None while some are still coming."""
        if not self.alive:
            raise SwitchGone
        with self._cond:
            if not all(x in self.done for x in xids):
                return None
            self.done.difference_update(xids)
        return [f for x in xids for f in self.replies.pop(x, [])]

    def forget(self, xids: list[int]) -> None:
        """Requests given up on: their answers, if they still come, are dropped."""
        with self._cond:
            self.done.difference_update(xids)
        for x in xids:
            self.replies.pop(x, None)

    def ask_cookies(self, cookies: list[int]) -> list[int]:
        """Ask for the installed flows with exactly these cookies, one request each, answered from the switch's
        cookie index (a chunk walks every flow of the switch); `collect` them later."""
        return self._ask([(c, openflow.ALL_COOKIE) for c in cookies])

    def _ask(self, requests: list[tuple[int, int]]) -> list[int]:
        """Flow-stats requests (cookie, mask) sent together; their xids."""
        xids = [self.xid() for _ in requests]
        for x in xids:
            self.replies[x] = []
        self._write([openflow.flow_stats_request_bytes(c, m, x) for (c, m), x in zip(requests, xids, strict=True)])
        return xids

    # --- events (called from os-ken's handlers) ---------------------------------------------------------------
    def on_stats(self, xid: int, body: list, more: bool) -> None:
        if xid in self.replies:
            self.replies[xid].extend(body)
            if not more:
                self._done(xid)
                if self.on_answer is not None:
                    self.on_answer()

    def on_barrier(self, xid: int) -> None:
        self._done(xid)

    def _done(self, xid: int) -> None:
        with self._cond:
            self.done.add(xid)
            self._cond.notify_all()

    def on_error(self, xid: int, text: str) -> None:
        if xid >= 0x80000000:
            self.errors[xid] = text


def n_chunks(flows: int) -> int:
    """A power of two giving about CHUNK_FLOWS flows per chunk."""
    n = 1
    while n < BUCKETS and flows / n > CHUNK_FLOWS:
        n *= 2
    return n


@dataclass
class AuditResult:
    add: list[Flow]
    delete: list[int]
    edited: int
    drops: dict[str, int]


def take_baselines(stats: list, desired: dict[int, Flow], baseline: dict[int, int],
                   changed: set[int] | frozenset[int] = frozenset()) -> None:
    """Flows just installed, read back by cookie: their bytes become the baseline `audit_chunk` compares with.
    `changed`: as for `audit_chunk`, cookies changed after the read was asked for (their bytes are old)."""
    for s in stats:
        if s.cookie in desired and s.cookie not in changed:
            baseline.setdefault(s.cookie, hash(s.content))


def audit_chunk(stats: list, desired: dict[int, Flow], chunk_cookies: Iterable[int],
                baseline: dict[int, int], changed: set[int] | frozenset[int] = frozenset()) -> AuditResult:
    """Compare one chunk read back with what is desired in it. `baseline` maps a cookie to the hash of its bytes
    as first read back after we installed it; different bytes under the same cookie: edited by hand. `changed`:
    cookies added or deleted after the chunk was asked for; what was read of them is already old, so they are
    left alone."""
    installed: dict[int, Any] = {s.cookie: s for s in stats}
    drops = {str(s.table_id): s.packet_count for s in stats if s.is_drop}
    add, edited = [], 0
    for c in chunk_cookies:
        if c in changed:
            continue
        s = installed.get(c)
        if s is None:
            add.append(desired[c])
            baseline.pop(c, None)
            continue
        h = hash(s.content)
        was = baseline.setdefault(c, h)
        if was != h:
            add.append(desired[c])
            del baseline[c]
            edited += 1
    delete = [c for c in installed if c not in desired and c not in changed]
    for c in delete:
        baseline.pop(c, None)
    return AuditResult(add, delete, edited, drops)
