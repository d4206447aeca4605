"""The config streams open on this process, and when each one's host was last heard from by TCP.

An open stream is its host's heartbeat (controller/api/host_stream.py), but an open connection proves nothing by
itself: a hypervisor that lost its power or its network leaves a half-open connection, and the kernel goes on
accepting our writes to it (retransmitting them for a quarter of an hour) while the host would stay up. What
proves the host there is its TCP stack acknowledging what we send, keep-alive probes included; the kernel keeps
that moment (TCP_INFO's `tcpi_last_ack_recv`), and each liveness tick notes a beat for every open stream at the
moment its host last acknowledged. So a host that vanished stops beating when it stopped acknowledging, and an
idle stream costs a getsockopt per tick instead of a keep-alive line every 2 s through the whole ASGI stack
(140 µs of CPU a line, 7% of a core at 1,000 hosts, measured on the fan-out bench).

The kernel probes a silent stream on its own (`prove`: SO_KEEPALIVE, a few probes per silence allowed, and
TCP_USER_TIMEOUT to drop a connection nobody acknowledges); a stream without a TCP socket (a Unix socket, the
tests' in-process transport) beats at each keep-alive line instead, as before.
"""

from __future__ import annotations

import socket
import struct
from datetime import timedelta
from typing import Any

from controller.southbound.liveness import Beats
from controller.southbound.watch import Subscription, Wake
from controller.state.models import now

_TCP_INFO_LEN = 104  # struct tcp_info up to tcpi_rcv_space: every kernel since 2.6 answers at least this
_STATE_AND_LAST_ACK = struct.Struct("B55xI")  # tcpi_state (1: established) ... tcpi_last_ack_recv (ms), offset 56
_ESTABLISHED = 1


def last_heard_ms(sock: Any) -> int | None:
    """Milliseconds since the peer of `sock` last acknowledged anything; None if it is not an established TCP
    connection (closed, or not TCP)."""
    try:
        state, ms = _STATE_AND_LAST_ACK.unpack_from(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO,
                                                                    _TCP_INFO_LEN))
    except (OSError, struct.error, ValueError):
        return None
    return ms if state == _ESTABLISHED else None


def prove(sock: Any, silence: float) -> bool:
    """Have the kernel probe `sock` when it is idle, often enough that a live peer acknowledges a few times per
    `silence` (the seconds a host may be silent), and drop it when nothing was acknowledged for a whole
    `silence`. False: not a TCP socket (the stream then beats at each keep-alive line)."""
    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6) \
            or last_heard_ms(sock) is None:
        return False
    probe = max(1, int(silence / 6))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, probe)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, probe)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(silence * 1000))
    except OSError:
        return False
    return True


class OpenStreams:
    """The streams of this process whose TCP connection proves their host alive (event loop only: no lock)."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[str, Any, Subscription]] = {}
        self._next = 0

    def add(self, host: str, sock: Any, sub: Subscription) -> int:
        self._next += 1
        self._open[self._next] = (host, sock, sub)
        return self._next

    def hosts(self) -> set[str]:
        return {host for host, _, _ in self._open.values()}

    def ask_reports(self, hosts: set[str]) -> int:
        """Ask `hosts` for their reports on their streams (an event each); how many streams. For a host the
        controller holds down, its report is what brings it and its ports back."""
        n = 0
        for host, _, sub in list(self._open.values()):
            if host in hosts:
                sub.queue.put_nowait(Wake(0, hosts=frozenset({host}), report=True))
                n += 1
        return n

    def remove(self, key: int) -> None:
        self._open.pop(key, None)

    def __len__(self) -> int:
        return len(self._open)

    def note_beats(self, beats: Beats, every: float) -> int:
        """A beat for each open stream's host at the moment it last acknowledged; how many."""
        t, n = now(), 0
        for host, sock, _ in list(self._open.values()):
            if (ms := last_heard_ms(sock)) is not None:  # None: closing meanwhile (its stream removes it)
                beats.note(host, every, at=t - timedelta(milliseconds=ms))
                n += 1
        return n
