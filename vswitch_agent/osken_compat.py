"""A fix for os-ken's native-thread hub (its default since eventlet was dropped), applied before it serves a switch.

With native threads `hub.kill` does nothing, so when a switch drops the connection, `Datapath.serve` waits for
its send thread, which sits in `send_q.get()` until something else is sent: the connection's DEAD event (what
tells the agent the switch is gone) came only when the agent next wrote to the dead socket, up to a barrier
timeout later, or never. Here the receive loop's end wakes the send thread with a last message that closes it.
"""

from __future__ import annotations

from typing import Any

from os_ken.controller import controller

_PATCHED = "_tianji_wakes_sender"


def wake_sender_when_receive_ends() -> None:
    cls: Any = controller.Datapath
    if getattr(cls, _PATCHED, False):
        return
    receive = cls._recv_loop  # os-ken's wrapper around it closes the socket when it returns

    def _recv_loop(self: Any) -> None:
        try:
            receive(self)
        finally:
            q = self.send_q
            # a full queue means the send thread is writing, and that write fails on the closed socket
            if q is not None and self._send_q_sem.acquire(blocking=False):
                q.put((b"", True))  # close_socket=True: the send loop ends after it

    cls._recv_loop = _recv_loop
    setattr(cls, _PATCHED, True)
