"""The config streams' compiles, batched: every stream woken while a batch runs is compiled in the next, together.

A port created in a VPC of twenty hosts wakes twenty streams; a host joining wakes them all. Compiled one by one,
each is a snapshot, a view, a read of what the cache lacks, and a rollback: four round trips and a session per
host, and under a burst the process spends its time on the same work a thousand times. Batched, it is one
snapshot for them all, their views in one round trip, the fragments none of them has in one more (each read once,
shared: controller/southbound/compiler.compile_hosts), the VTEP entries in a third. A batch starts as soon as
one is asked for and fewer than MAX_BATCHES run, so a lone change is not delayed; under load the batches grow instead
of the queue (at most MAX_BATCH streams each)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.serving import watch_thread
from controller.southbound.host_deltas import Asked, compile_host_deltas
from controller.state.db import Database
from tianji.southbound import HostConfigDelta

MAX_BATCHES = 2  # at once, per process: one compiling while the next fills
MAX_BATCH = 500


@dataclass
class StreamHub:
    db: Database
    pending: list[tuple[Asked, asyncio.Future]] = field(default_factory=list)
    running: int = 0
    batches: int = 0  # for the tests and the operator: how many batches, of how many streams in all
    compiled: int = 0
    timed: Callable[[float], None] | None = None  # told each batch's compile time (the controller's metrics)

    async def compile(self, asked: Asked) -> HostConfigDelta | None:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending.append((asked, fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        while self.pending and self.running < MAX_BATCHES:
            batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            self.running += 1
            asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[Asked, asyncio.Future]]) -> None:
        try:
            t0 = time.perf_counter()
            out = await watch_thread(lambda: self._compile([a for a, _ in batch]))
            if self.timed is not None:
                self.timed(time.perf_counter() - t0)
            for (_, fut), d in zip(batch, out, strict=True):
                if not fut.done():
                    fut.set_result(d)
        except Exception as e:  # each stream says it to its watcher, which asks again
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
        finally:
            self.running -= 1
            self.batches += 1
            self.compiled += len(batch)
            self._kick()

    def _compile(self, asked: list[Asked]) -> list[HostConfigDelta | None]:
        with self.db.snapshot() as s:
            return compile_host_deltas(s, asked)
