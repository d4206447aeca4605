"""os-ken's native hub: a connection the switch drops must end (and say DEAD) at once, not when we next write."""

from __future__ import annotations

import socket
import threading

from os_ken.base import app_manager  # noqa: F401 - imported before controller (os-ken's import order)
from os_ken.controller import controller
from os_ken.controller.handler import DEAD_DISPATCHER

from vswitch_agent.osken_compat import wake_sender_when_receive_ends


def test_a_connection_the_switch_closes_ends_while_nothing_is_being_sent() -> None:
    wake_sender_when_receive_ends()
    listener = socket.create_server(("127.0.0.1", 0))
    switch = socket.create_connection(listener.getsockname())
    conn, addr = listener.accept()
    dp = controller.Datapath(conn, addr)
    served = threading.Thread(target=dp.serve, daemon=True)
    served.start()
    assert switch.recv(8)  # the controller's hello: the send thread has sent it and now waits for more
    switch.close()
    served.join(timeout=5)
    assert not served.is_alive(), "serve() still waits for its send thread after the switch closed"
    dp.close()  # what os-ken's connection factory does next: the DEAD event the agent acts on
    assert dp.state == DEAD_DISPATCHER
    listener.close()
