"""Where a service endpoint's connections live: one owner, one protocol (`ConnStore`). The reference's decisions
(reference.py's ServiceTable) run over it whichever store holds them: `DictConns`, dicts in this process, or the
native one (native.py's `NativeConns`: C holds the connections it carries, which is every one but PROXY v2's, and
expires them itself by the timeouts pushed down to it). A connection lives in one place; nothing is copied back and
forth.

The rules every store keeps alike (native/dp_svc.c, step for step): a connection is keyed from the VM (`Inside`)
and from the service (`Outside`); `add` refuses one whose outside key is taken (the caller tries another source
port); a connection idle past its timeout (TCP established 3600 s, TCP opening or closing 120 s, UDP 120 s) is
removed by `expire`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from nfv_gateways.core.packet import PROTO_TCP
from nfv_gateways.roles.service.policy import EndpointPolicy

TIMEOUT_ESTABLISHED, TIMEOUT_TRANSITORY, TIMEOUT_UDP = 3600.0, 120.0, 120.0
Inside = tuple[int, int, int, int, int, int]  # (vni, VM ip, VM port, proto, endpoint ip, port)
Outside = tuple[int, int, int, int, int, int]  # (via VNI, proto, service ip, port, source, source port)


@dataclass(slots=True)
class Conn:
    ep: EndpointPolicy
    vm: int
    vm_port: int
    proto: int
    port: int  # the service's, the same on both sides
    svc: int
    sport: int  # on the endpoint's source address
    last: float
    established: bool = False
    closing: bool = False
    back: int = 0  # the VNI replies go back in: the endpoint's, or a peered VPC's (EndpointPolicy.back_vni)
    pp: bytes | None = None  # the PROXY header of a proxy-protocol connection
    isn: int = 0  # the VM's initial sequence number
    header_acked: bool = False

    def inside(self) -> Inside:
        return self.ep.vni, self.vm, self.vm_port, self.proto, self.ep.ip, self.port

    def outside(self) -> Outside:
        return self.ep.via_vni, self.proto, self.svc, self.port, self.ep.source, self.sport


def timeout_of(c: Conn) -> float:
    if c.proto != PROTO_TCP:
        return TIMEOUT_UDP
    return TIMEOUT_ESTABLISHED if c.established and not c.closing else TIMEOUT_TRANSITORY


class ConnStore(Protocol):
    """The connections. What `find_*` return is the store's answer at that moment: a change to it counts once
    `put`."""

    def find_in(self, key: Inside) -> Conn | None: ...
    def find_out(self, key: Outside) -> Conn | None: ...
    def add(self, c: Conn) -> bool:
        """`c` held from now on; False when its outside key is taken (nothing held)."""
        ...
    def put(self, c: Conn) -> None: ...
    def drop(self, c: Conn) -> None: ...
    def conns(self, vni: int | None = None) -> list[Conn]: ...
    def expire(self, now: float) -> int: ...
    def __len__(self) -> int: ...


class DictConns:
    """The connections in this process's dicts."""

    def __init__(self) -> None:
        self.inside: dict[Inside, Conn] = {}
        self.outside: dict[Outside, Conn] = {}

    def find_in(self, key: Inside) -> Conn | None:
        return self.inside.get(key)

    def find_out(self, key: Outside) -> Conn | None:
        return self.outside.get(key)

    def add(self, c: Conn) -> bool:
        if c.outside() in self.outside or c.inside() in self.inside:
            return False
        self.inside[c.inside()] = self.outside[c.outside()] = c
        return True

    def put(self, c: Conn) -> None:
        """The caller's connection is the one held (`find_*` hand it out itself)."""

    def drop(self, c: Conn) -> None:
        if self.inside.get(c.inside()) is c:
            del self.inside[c.inside()]
            del self.outside[c.outside()]

    def conns(self, vni: int | None = None) -> list[Conn]:
        return [c for c in self.inside.values() if vni is None or c.ep.vni == vni]

    def expire(self, now: float) -> int:
        dead = [c for c in self.inside.values() if now - c.last > timeout_of(c)]
        for c in dead:
            self.drop(c)
        return len(dead)

    def __len__(self) -> int:
        return len(self.inside)


__all__ = ["Conn", "ConnStore", "DictConns", "Inside", "Outside", "timeout_of"]
