"""Relays VMs' queries for names outside the VPC's zone to the operator's resolver (`tianji agent
--dns-forwarder IP[:PORT]`), from the hypervisor, and the answers back to the VM that asked as packet-outs. One UDP
socket: each query gets an id of ours, so an answer meets its VM whatever ids the VMs chose (and a forged answer
with an id not in flight, or from another address, is dropped). Bounded: at most LIMIT in flight, each forgotten
after TIMEOUT (the VM's resolver retries)."""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable

from vswitch_agent.dns import Query, frame_to_vm

log = logging.getLogger("tianji.agent")
LIMIT = 1024
TIMEOUT = 3.0


def parse_server(spec: str) -> tuple[str, int]:
    """IP or IP:PORT (53 by default); ValueError naming what is wrong."""
    host, _, port = spec.partition(":")
    socket.inet_aton(host)  # an address, not a name: the agent must not need a resolver to reach the resolver
    p = int(port or 53)
    if not 0 < p < 65536:
        raise ValueError(f"port {p} out of range")
    return host, p


class Forwarder:
    def __init__(self, server: tuple[str, int], send: Callable[[int, bytes], None]) -> None:
        self.server, self.send = server, send
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect(server)
        self.pending: dict[int, tuple[float, int, Query, str]] = {}  # our id -> (sent, ofport, query, router MAC)
        self.counters = {"forwarded": 0, "answered": 0, "dropped": 0}

    def forward(self, q: Query, ofport: int, router_mac: str) -> bool:
        """Send `q` on; False when too many are in flight or it cannot be sent (the caller answers REFUSED)."""
        now = time.monotonic()
        if len(self.pending) >= LIMIT:
            for k in [k for k, v in self.pending.items() if now - v[0] > TIMEOUT]:
                del self.pending[k]
            if len(self.pending) >= LIMIT:
                self.counters["dropped"] += 1
                return False
        ident = secrets.randbelow(65536)
        while ident in self.pending:
            ident = secrets.randbelow(65536)
        self.pending[ident] = (now, ofport, q, router_mac)
        try:
            self.sock.send(struct.pack("!H", ident) + q.message[2:])
        except OSError as e:
            del self.pending[ident]
            log.warning("DNS forwarder %s:%d: %s", *self.server, e)
            return False
        self.counters["forwarded"] += 1
        return True

    def run(self) -> None:
        """Answers back to their VMs, forever (a thread of the agent's)."""
        while True:
            try:
                msg = self.sock.recv(4096)
            except OSError:  # ICMP port unreachable from the server: the next query tries again
                time.sleep(0.1)
                continue
            if len(msg) < 12 or (entry := self.pending.pop(struct.unpack_from("!H", msg, 0)[0], None)) is None:
                continue
            _, ofport, q, router_mac = entry
            self.send(ofport, frame_to_vm(q, struct.pack("!H", q.ident) + msg[2:], router_mac))
            self.counters["answered"] += 1


__all__ = ["Forwarder", "parse_server"]
