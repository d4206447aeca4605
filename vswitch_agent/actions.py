"""OpenFlow actions as typed values: what a flow does, one class per action kind.

Each action is a tuple subclass whose first item is its kind (`Output(5) == ("output", 5)`): as cheap to build,
hash and compare as the tuples they are (a host holds 100,000s of flows), never equal across kinds (`Output(5) !=
GotoTable(5)`), and with named, typed fields for the code that reads them (`openflow.py` encodes them, `pipeline.py`
verifies them, the test switch runs them). The repr is the plain tuple's, which keeps the flows' cookies stable.
"""

from __future__ import annotations

from typing import ClassVar


class Action(tuple):
    """Base of every action kind; `kind` is the first item."""

    __slots__ = ()
    kind: ClassVar[str]

    def __repr__(self) -> str:
        return tuple.__repr__(self)


class Output(Action):
    """Send the packet out of an OpenFlow port (OFPP_IN_PORT: where it came from)."""

    __slots__ = ()
    kind = "output"

    def __new__(cls, port: int) -> Output:
        return tuple.__new__(cls, ("output", port))

    @property
    def port(self) -> int:
        return self[1]


class OutputReg(Action):
    """Send the packet out of the port a register names (Nicira output:reg)."""

    __slots__ = ()
    kind = "output_reg"

    def __new__(cls, field: str) -> OutputReg:
        return tuple.__new__(cls, ("output_reg", field))

    @property
    def field(self) -> str:
        return self[1]


class Controller(Action):
    """Send the packet to the agent (packet-in, no buffering)."""

    __slots__ = ()
    kind = "controller"

    def __new__(cls) -> Controller:
        return tuple.__new__(cls, ("controller",))


class SetField(Action):
    """Set a header field, or metadata (an instruction in OpenFlow 1.3, not an action; openflow.py knows)."""

    __slots__ = ()
    kind = "set"

    def __new__(cls, field: str, value: int | str) -> SetField:
        return tuple.__new__(cls, ("set", field, value))

    @property
    def field(self) -> str:
        return self[1]

    @property
    def value(self) -> int | str:
        return self[2]


class Load(Action):
    """Load `value` into bits [ofs, ofs + nbits) of a field or register (Nicira reg_load)."""

    __slots__ = ()
    kind = "load"

    def __new__(cls, field: str, ofs: int, nbits: int, value: int) -> Load:
        return tuple.__new__(cls, ("load", field, ofs, nbits, value))

    @property
    def field(self) -> str:
        return self[1]

    @property
    def ofs(self) -> int:
        return self[2]

    @property
    def nbits(self) -> int:
        return self[3]

    @property
    def value(self) -> int:
        return self[4]


class Move(Action):
    """Copy `nbits` bits from one field to another (Nicira reg_move)."""

    __slots__ = ()
    kind = "move"

    def __new__(cls, src: str, dst: str, nbits: int) -> Move:
        return tuple.__new__(cls, ("move", src, dst, nbits))

    @property
    def src(self) -> str:
        return self[1]

    @property
    def dst(self) -> str:
        return self[2]

    @property
    def nbits(self) -> int:
        return self[3]


class DecTtl(Action):
    """Decrement the IPv4 TTL; at 0 the packet goes to the controller (it answers time exceeded)."""

    __slots__ = ()
    kind = "dec_ttl"

    def __new__(cls) -> DecTtl:
        return tuple.__new__(cls, ("dec_ttl",))


class CheckPktLarger(Action):
    """Set bit `bit` of register `field` when the frame (Ethernet header included) is longer than `length` bytes
    (OVS's check_pkt_larger): how a route to a smaller MTU finds what it must answer with packet too big."""

    __slots__ = ()
    kind = "check_pkt_larger"

    def __new__(cls, length: int, field: str, bit: int) -> CheckPktLarger:
        return tuple.__new__(cls, ("check_pkt_larger", length, field, bit))

    @property
    def length(self) -> int:
        return self[1]

    @property
    def field(self) -> str:
        return self[2]

    @property
    def bit(self) -> int:
        return self[3]


class Nat(Action):
    """Inside a Ct: translate the destination to `ip`:`port` when committing a new connection; with no address,
    apply the translation the connection already has (both directions)."""

    __slots__ = ()
    kind = "nat"

    def __new__(cls, ip: str | None = None, port: int | None = None) -> Nat:
        return tuple.__new__(cls, ("nat", ip, port))

    @property
    def ip(self) -> str | None:
        return self[1]

    @property
    def port(self) -> int | None:
        return self[2]


class Multipath(Action):
    """Hash the flow's symmetric 5-tuple (UDP ports included) into one of `n` links, highest random weight (a link
    that goes moves only its own flows), and load the link's number into bits [0, 16) of `dst` (Nicira
    multipath)."""

    __slots__ = ()
    kind = "multipath"

    def __new__(cls, n: int, dst: str) -> Multipath:
        return tuple.__new__(cls, ("multipath", n, dst))

    @property
    def n(self) -> int:
        return self[1]

    @property
    def dst(self) -> str:
        return self[2]


class Ct(Action):
    """Send through conntrack in `zone`, optionally committing with `exec_` (Loads of ct_mark/ct_label, a Nat), then
    continue in `table` (recirculated with ct_state set) or, with table None, in the current actions."""

    __slots__ = ()
    kind = "ct"

    def __new__(cls, commit: bool, zone: int, table: int | None, exec_: tuple[Action, ...] = ()) -> Ct:
        return tuple.__new__(cls, ("ct", commit, zone, table, tuple(exec_)))

    @property
    def commit(self) -> bool:
        return self[1]

    @property
    def zone(self) -> int:
        return self[2]

    @property
    def table(self) -> int | None:
        return self[3]

    @property
    def exec_(self) -> tuple[Action, ...]:
        return self[4]


class Conjunction(Action):
    """Clause `clause` (1-based) of `n` of conjunction `id` (Nicira conjunction)."""

    __slots__ = ()
    kind = "conj"

    def __new__(cls, id_: int, clause: int, n: int) -> Conjunction:
        return tuple.__new__(cls, ("conj", id_, clause, n))

    @property
    def id(self) -> int:
        return self[1]

    @property
    def clause(self) -> int:
        return self[2]

    @property
    def n(self) -> int:
        return self[3]


class GotoTable(Action):
    """Continue in a later table (an instruction, last in the flow)."""

    __slots__ = ()
    kind = "goto"

    def __new__(cls, table: int) -> GotoTable:
        return tuple.__new__(cls, ("goto", table))

    @property
    def table(self) -> int:
        return self[1]


KINDS: dict[str, type[Action]] = {c.kind: c for c in (Output, OutputReg, Controller, SetField, Load, Move, DecTtl,
                                                        Ct, Nat, Multipath, Conjunction, GotoTable)}

__all__ = ["KINDS", "Action", "Conjunction", "Controller", "Ct", "DecTtl", "GotoTable", "Load", "Move", "Multipath",
           "Nat", "Output", "OutputReg", "SetField"]
