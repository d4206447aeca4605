"""Where the NAT's mappings live: one owner, one protocol (`FlowStore`). The reference's decisions
(reference.py's NatTable) run over it whichever store holds the flows: `DictStore`, dicts in this process (the
reference alone, the tests), or the native table (native.py's `CStore`: the C table the packet loop translates
with). Configuration flows down into the store (`configure`: the port slice, the timeouts); the flows' state lives
in it alone, and expiry is the store's own, by those timeouts.

The rules every store keeps alike (the C table in native/nat_flows.c, step for step):
* A new mapping's public port: the internal port itself if free (port preservation), else the next free one after
  a per-(EIP, protocol) cursor. A TCP port whose mapping ended less than TCP_PORT_HOLD ago is not free (the
  server may hold the old connection in TIME_WAIT: a new one on the same addresses and ports would be refused).
* No room: a full table (`capacity`, three quarters of the C table's slots) creates no mapping (TABLE_FULL); a
  mapping remembers its last NAT_MAX_PEERS remote endpoints, and sending to one more forgets the oldest.
* Expiry: a mapping idle past its protocol's timeout (TCP: established or transitory) is removed, its TCP port
  held until TCP_PORT_HOLD after its last packet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from nfv_gateways.core.packet import PROTO_TCP, PROTO_UDP
from nfv_gateways.roles.nat.policy import NatSettings

# A TCP port whose mapping was removed (its rule went away with a released EIP, which the next tenant may get) is
# not handed to another internal endpoint for this long after its last packet: the server may hold the old
# connection in TIME_WAIT (2MSL), and a new connection on the same addresses and ports is refused until it ends
# (PAWS drops the SYN when the new client's timestamps are behind the old one's). Expired mappings are past it.
TCP_PORT_HOLD = 120.0
NAT_MAX_PEERS = 4  # include/tj_api.h's (a test holds them equal)
NO_PORT, TABLE_FULL = -1, -2  # why `create` made no mapping (tj_api.h's NAT_NO_PORT, NAT_TABLE_FULL)

Peer = tuple[int, int]  # a remote endpoint: (address, port; 0 for ICMP)


@dataclass(slots=True)
class Mapping:
    vni: int
    ip: int
    port: int
    proto: int
    eip: int
    eport: int
    last: float
    peers: list[Peer] = field(default_factory=list)  # oldest first
    tcp_established: bool = False
    tcp_closing: bool = False

    @property
    def inside(self) -> tuple[int, int, int, int]:
        return (self.vni, self.ip, self.port, self.proto)


def capacity_of(slots: int) -> int:
    """How many mappings a native table of `slots` holds (its probe chains stay short: a quarter stays free)."""
    return slots // 4 * 3


def add_peer(m: Mapping, peer: Peer) -> bool:
    """`peer` remembered as one `m` sent to; True when the oldest was forgotten for it."""
    if peer in m.peers:
        return False
    full = len(m.peers) >= NAT_MAX_PEERS
    if full:
        del m.peers[0]
    m.peers.append(peer)
    return full


def idle_timeout(m: Mapping, s: NatSettings) -> float:
    t = s.timeouts
    if m.proto == PROTO_TCP:
        return t.tcp_established if m.tcp_established and not m.tcp_closing else t.tcp_transitory
    return t.udp if m.proto == PROTO_UDP else t.icmp


class FlowStore(Protocol):
    """The mappings. What `find_*` return is the store's answer at that moment: a change to it counts once `put`."""

    def configure(self, settings: NatSettings) -> None: ...
    def find_in(self, vni: int, ip: int, port: int, proto: int) -> Mapping | None: ...
    def find_out(self, eip: int, eport: int, proto: int) -> Mapping | None: ...
    def create(self, m: Mapping, now: float) -> Mapping | int:
        """A new mapping like `m` (its EIP, first peers, TCP state, last time), with a public port from the slice;
        NO_PORT or TABLE_FULL when none was made (a mapping already under its inside key is returned as it is)."""
        ...
    def put(self, m: Mapping) -> None:
        """What the caller saw of a mapping it found (last time, new peers, TCP state), kept."""
        ...
    def delete(self, m: Mapping, hold_until: float = 0.0) -> None: ...
    def mappings(self, vni: int | None = None) -> list[Mapping]: ...
    def expire(self, now: float) -> int:
        """Remove the mappings idle past their timeout; how many."""
        ...
    def __len__(self) -> int: ...


class DictStore:
    """The flows in this process's dicts."""

    def __init__(self, capacity: int | None = None) -> None:
        """`capacity`: how many mappings it holds at most (None: no bound; the native table's: `capacity_of`)."""
        self.capacity = capacity
        self.settings = NatSettings()
        self.by_inside: dict[tuple[int, int, int, int], Mapping] = {}
        self.by_outside: dict[tuple[int, int, int], Mapping] = {}
        self.held: dict[tuple[int, int, int], float] = {}  # (EIP, port, TCP): not handed out before this time
        self.cursor: dict[tuple[int, int], int] = {}

    def configure(self, settings: NatSettings) -> None:
        self.settings = settings

    def find_in(self, vni: int, ip: int, port: int, proto: int) -> Mapping | None:
        return self.by_inside.get((vni, ip, port, proto))

    def find_out(self, eip: int, eport: int, proto: int) -> Mapping | None:
        return self.by_outside.get((eip, eport, proto))

    def create(self, m: Mapping, now: float) -> Mapping | int:
        if (old := self.by_inside.get(m.inside)) is not None:
            return old
        eport = self._alloc_port(m.eip, m.proto, m.port, now)
        if eport is None:
            return NO_PORT
        if self.capacity is not None and len(self.by_inside) >= self.capacity:
            return TABLE_FULL
        m.eport = eport  # the caller's new record is adopted, not copied: it holds it only to ask for it
        del m.peers[:-NAT_MAX_PEERS]
        self.by_inside[m.inside] = self.by_outside[(m.eip, eport, m.proto)] = m
        return m

    def put(self, m: Mapping) -> None:
        """The caller's mapping is the one held (`find_*` hand it out itself)."""

    def delete(self, m: Mapping, hold_until: float = 0.0) -> None:
        if self.by_inside.get(m.inside) is not m:
            return
        del self.by_inside[m.inside]
        del self.by_outside[(m.eip, m.eport, m.proto)]
        if hold_until > 0:
            self.held[(m.eip, m.eport, m.proto)] = hold_until

    def mappings(self, vni: int | None = None) -> list[Mapping]:
        return [m for m in self.by_inside.values() if vni is None or m.vni == vni]

    def expire(self, now: float) -> int:
        dead = [m for m in self.by_inside.values() if now - m.last > idle_timeout(m, self.settings)]
        for m in dead:
            self.delete(m, m.last + TCP_PORT_HOLD if m.proto == PROTO_TCP else 0.0)
        self.held = {k: until for k, until in self.held.items() if until > now}
        return len(dead)

    def __len__(self) -> int:
        return len(self.by_inside)

    def _alloc_port(self, eip: int, proto: int, want: int, now: float) -> int | None:
        """The internal port itself if free (port preservation), else the next free one after a per-(EIP,
        protocol) cursor: O(1) while ports are plentiful, a full scan only when the slice is nearly full."""
        lo, hi = self.settings.port_lo, self.settings.port_hi

        def free(p: int) -> bool:
            key = (eip, p, proto)
            return key not in self.by_outside and (key not in self.held or self.held[key] <= now)

        if lo <= want <= hi and free(want):
            return want
        size = hi - lo + 1
        start = self.cursor.get((eip, proto), lo)
        for i in range(size):
            p = lo + (start - lo + i) % size
            if free(p):
                self.cursor[(eip, proto)] = lo + (p - lo + 1) % size
                return p
        return None
