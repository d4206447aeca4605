"""The liveness loop: every tick, the open streams' beats noted, streaming hosts held down asked for their reports,
every beat written, and (on the leader) the silent hosts marked down. Started by the app (`controller/app.py`) with
its state: the settings, the database, the beats (`liveness.py`), the open streams (`open_streams.py`), the
broadcaster, the collector and the leadership (`controller/replicas.py`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from controller.settings import Settings
from controller.southbound.liveness import beat_every, held_down, mark_silent_hosts_down
from controller.southbound.watch import Broadcaster

log = logging.getLogger("tianji.controller")


async def _ask_held_down_for_reports(state: Any) -> None:
    """A host the database holds down whose stream is open here (marked down while a stall kept its beats from
    being written) is asked for its report on its stream, which brings it and its ports back."""
    try:
        held = await asyncio.to_thread(held_down, state.db, state.open_streams.hosts())
        if held and (n := state.open_streams.ask_reports(held)):
            log.warning("asked %d streaming host(s) held down for their reports (%s)", n,
                        ", ".join(sorted(held)[:5]))
    except Exception as e:  # the next round looks again
        log.warning("looking for streaming hosts held down failed: %s", e)


async def run(state: Any) -> None:
    """On the leader (controller.replicas): marks silent hosts down, checking every quarter of the shortest
    silence allowed (at least every 2 s). A check that comes late (this process was stalled: beats that arrived
    meanwhile may not be written yet) marks nobody down: a stalled controller must not fail over gateways that
    kept beating; the round after it judges (its tick let the queued beats in). Followers only write the beats
    they received."""
    s: Settings = state.settings
    bc: Broadcaster = state.broadcaster
    tick = max(0.05, min(2.0, s.host_down_after / 4, s.gateway_down_after / 4))
    every = beat_every(s.host_down_after)
    streams_noted = streams_judged = 0.0
    skipped = False
    while True:
        t0 = time.monotonic()
        await asyncio.sleep(tick)
        # the wake itself late: the loop stalled, and beats may be queued behind the stall (the work of this round
        # below is not lateness); judged anyway after one skipped round, or a loaded process never judges at all
        late = time.monotonic() - t0 > tick + min(0.25, s.gateway_down_after / 4) and not skipped
        if t0 - streams_noted >= every / 2:  # the open streams' beats: what their hosts last acknowledged
            state.open_streams.note_beats(state.beats, every)
            streams_noted = t0
        if t0 - streams_judged >= s.host_down_after:  # streaming hosts held down: their agents must report
            streams_judged = t0
            await _ask_held_down_for_reports(state)
        state.collector.tick(bc.recent[-1] if bc.recent else None)
        skipped = late
        if late or not state.leadership.leading() or state.stopping:
            # the beats are written even late (a worker stalled at every tick under load kept its hosts' beats
            # to itself, and the leader marked them down); only the judging waits a round for the beats that
            # queued behind the stall. A follower writes the beats it received; the leader judges them.
            try:
                await asyncio.to_thread(state.beats.flush, state.db)
            except Exception as e:
                log.warning("writing heartbeats failed: %s", e)
            continue
        try:
            # a thousand hosts whose streams were on a replica that died (or on this process before a restart)
            # reconnect with jitter: no hypervisor is judged until it had a whole silence to find this one
            settled = time.monotonic() - state.leadership.since >= s.host_down_after
            down = await asyncio.to_thread(mark_silent_hosts_down, state.db, s.host_down_after,
                                           s.gateway_down_after, state.beats, settled)
            for name in down:
                log.warning("host %s silent too long: marked down, its ports DOWN", name)
        except Exception as e:  # keep checking through transient database errors
            log.warning("liveness check failed: %s", e)
