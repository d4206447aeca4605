"""An in-memory model of OpenFlow tables and conntrack: what the unit tests walk the flow computation with, and
what the reachability analyzer (controller/reachability) runs a tenant's question through.

It installs what the agent would send: every flow is encoded by `vswitch_agent.openflow.flow_add_bytes`, parsed
back by os-ken's OpenFlow 1.3 parser, and the parsed match and instructions are what the model runs, so a flow
that the encoder gets wrong fails here as it would on a switch. Installing refuses two flows of one table and
priority that can match the same packet (Open vSwitch picks either: the pipeline must never leave it a choice).

A packet (a dict of header fields) goes in; the model walks the tables the way Open vSwitch would and returns what
comes out: (port, packet) pairs, and packet-ins for the controller; `hits` is the path it took (a table and the
flow that matched there, for each step), which the analyzer explains. It models exactly the match fields and actions
`flows.py` uses, and raises on anything else so a new action cannot go untested.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from os_ken.ofproto import ofproto_parser, ofproto_protocol
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from vswitch_agent import openflow
from vswitch_agent import pipeline as P
from vswitch_agent.flow import Flow

CONTROLLER = "controller"
MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
# os-ken parses OVS's ND extension fields (openflow.EricSetField) by number: their names here
ERIC_KEYS = {f"field_{(openflow.ERICOXM_OF << 7) | n}": name for name, (n, _) in openflow.ERIC_FIELDS.items()}
NO_RECIRC = openflow.NX_CT_RECIRC_NONE
_DP = ofproto_protocol.ProtocolDesc(ofp.OFP_VERSION)


class OverlapError(AssertionError):
    """Two flows of one table and priority that can match the same packet."""


def _as_int(v: Any) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.count(".") == 3:
        return int(ipaddress.IPv4Address(v))
    if isinstance(v, str) and MAC.match(v):  # not by its colons: fd00:7469:0:400:: has five too
        return int(v.replace(":", ""), 16)
    if isinstance(v, str) and ":" in v:
        return int(ipaddress.IPv6Address(v))
    raise TypeError(f"cannot compare {v!r}")


def _value_mask(v: Any) -> tuple[int, int]:
    if isinstance(v, tuple):
        return _as_int(v[0]), _as_int(v[1])
    return _as_int(v), -1  # every bit


def field_matches(pkt: dict, name: str, want: Any) -> bool:
    have = pkt.get(name)
    if name == "ct_state" and have is None:
        have = 0
    if have is None:
        return False
    value, mask = _value_mask(want)
    return _as_int(have) & mask == value & mask


@dataclass(frozen=True)
class WireFlow:
    """A flow as the switch receives it: os-ken's parse of the bytes the agent sends."""

    table: int
    priority: int
    cookie: int
    match: tuple[tuple[str, Any], ...]
    actions: tuple[Any, ...]  # os-ken action objects (apply-actions), in order
    metadata: int | None  # write-metadata instruction
    goto: int | None  # goto-table instruction

    @classmethod
    def of(cls, f: Flow) -> WireFlow:
        data = openflow.flow_add_bytes(f, 1)
        version, msg_type, length, xid = ofproto_parser.header(data)
        msg = ofproto_parser.msg(_DP, version, msg_type, length, xid, data)
        actions, metadata, goto = [], None, None
        for inst in msg.instructions:
            if isinstance(inst, parser.OFPInstructionActions):
                actions += inst.actions
            elif isinstance(inst, parser.OFPInstructionWriteMetadata):
                metadata = inst.metadata
            elif isinstance(inst, parser.OFPInstructionGotoTable):
                goto = inst.table_id
            else:
                raise NotImplementedError(f"instruction {inst!r} is not modelled")
        return cls(msg.table_id, msg.priority, msg.cookie, tuple(msg.match.items()), tuple(actions), metadata, goto)

    def m(self) -> dict[str, Any]:
        return dict(self.match)

    @property
    def conjunctive(self) -> bool:
        return bool(self.actions) and all(isinstance(a, parser.NXActionConjunction) for a in self.actions)


def overlap(a: WireFlow, b: WireFlow) -> bool:
    """Whether some packet matches both and the two do different things (same table and priority assumed).
    Clause flows of conjunctions share a priority by design, and a conj_id flow is reached only through its
    conjunction; two flows that do the same thing leave Open vSwitch no choice that matters."""
    if a.conjunctive and b.conjunctive:
        return False
    if (repr(a.actions), a.metadata, a.goto) == (repr(b.actions), b.metadata, b.goto):
        return False
    if ("conj_id" in a.m()) != ("conj_id" in b.m()):
        return False
    bm = b.m()
    for name, want in a.match:
        if name in bm:
            (va, ma), (vb, mb) = _value_mask(want), _value_mask(bm[name])
            if va & ma & mb != vb & ma & mb:
                return False
    return True


@dataclass(frozen=True)
class Hit:
    """One step of a packet's walk: the table and the flow it matched there (None: no flow matched, a miss)."""

    table: int
    flow: WireFlow | None
    conj_id: int | None = None  # the conjunction (a security group rule's id) that matched, if the flow is its
    pkt: dict = field(default_factory=dict)  # the packet as it met the table


@dataclass
class Conn:
    mark: int = 0
    label: int = 0
    replied: bool = False
    dnat: tuple[str, int] | None = None  # the translated destination (address, port)
    orig: tuple[str, int] | None = None  # ... and the original one


@dataclass
class Switch:
    """Tables built from `flows` (re-installed whenever `flows` is set), and conntrack."""

    flows: set[Flow]
    conntrack: dict[int, dict[tuple, tuple[Conn, bool]]] = field(default_factory=dict)  # zone -> tuple -> (conn, reply)
    hits: list[Hit] = field(default_factory=list)  # the last injected packet's path

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "flows":
            super().__setattr__("tables", self.install(value))

    @staticmethod
    def install(flows: Iterable[Flow]) -> dict[int, list[WireFlow]]:
        """Each table's flows, highest priority first; OverlapError for an ambiguous pair."""
        levels: dict[tuple[int, int], list[WireFlow]] = {}
        for f in flows:
            w = WireFlow.of(f)
            level = levels.setdefault((w.table, w.priority), [])
            for other in level:
                if overlap(w, other):
                    raise OverlapError(f"flows of equal priority overlap:\n  {other}\n  {w}")
            level.append(w)
        tables: dict[int, list[WireFlow]] = {}
        for (table, _), level in sorted(levels.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
            tables.setdefault(table, []).extend(level)
        return tables

    def inject(self, pkt: dict) -> list[tuple[Any, dict]]:
        pkt = dict(pkt)
        pkt.setdefault("metadata", 0)
        for r in range(8):
            pkt.setdefault(f"reg{r}", 0)
        self.hits = []
        return self._run(pkt, 0, depth=0)

    def _lookup(self, table: list[WireFlow], pkt: dict) -> WireFlow | None:
        """The highest-priority match, with conjunctive matches as Open vSwitch does them: at one priority, a
        conjunction whose every clause matched stands for the flow matching conj_id=id (and the rest)."""
        i = 0
        while i < len(table):
            prio = table[i].priority
            level = []
            while i < len(table) and table[i].priority == prio:
                level.append(table[i])
                i += 1
            hits = [f for f in level if "conj_id" not in f.m() and all(field_matches(pkt, k, v) for k, v in f.match)]
            plain = [f for f in hits if not f.conjunctive]
            if plain:
                return plain[0]  # install() made sure there is one
            clauses: dict[int, set[int]] = {}
            n_of: dict[int, int] = {}
            for f in hits:
                for a in f.actions:
                    clauses.setdefault(a.id, set()).add(a.clause)
                    n_of[a.id] = a.n_clauses
            for cid in sorted(c for c, ks in clauses.items() if len(ks) == n_of[c]):
                probe = pkt | {"conj_id": cid}
                for f in level:
                    if "conj_id" in f.m() and all(field_matches(probe, k, v) for k, v in f.match):
                        return f
        return None

    def _run(self, pkt: dict, table_id: int, depth: int) -> list[tuple[Any, dict]]:
        if depth > 32:
            raise RuntimeError("pipeline loop")
        f = self._lookup(self.tables.get(table_id, []), pkt)
        self.hits.append(Hit(table_id, f, f.m().get("conj_id") if f is not None else None, dict(pkt)))
        if f is None:
            return []
        out: list[tuple[Any, dict]] = []
        for a in f.actions:
            result = self._act(a, pkt, out)
            if result is _STOP:
                return out
            if isinstance(result, int):  # conntrack recirculated to a table
                return out + self._run(pkt, result, depth + 1)
        if f.metadata is not None:
            pkt["metadata"] = f.metadata
        if f.goto is not None:
            assert f.goto > table_id, "goto must move forward"
            return out + self._run(pkt, f.goto, depth + 1)
        return out

    def _act(self, a: Any, pkt: dict, out: list) -> Any:
        """Apply one action; _STOP ends the packet, an int recirculates it to that table."""
        if isinstance(a, parser.OFPActionSetField) and a.key in ERIC_KEYS:  # os-ken's base64 of unknown fields
            pkt[ERIC_KEYS[a.key]] = int.from_bytes(base64.b64decode(a.value), "big")
        elif isinstance(a, parser.OFPActionSetField):
            pkt[a.key] = a.value
        elif isinstance(a, parser.NXActionRegLoad):
            ofs, nbits = a.ofs_nbits >> 6, (a.ofs_nbits & 0x3F) + 1
            mask = ((1 << nbits) - 1) << ofs
            pkt[a.dst] = (_as_int(pkt.get(a.dst, 0)) & ~mask) | ((a.value << ofs) & mask)
        elif isinstance(a, parser.NXActionRegMove):
            assert a.src_ofs == a.dst_ofs == 0, "moves of whole fields only"
            pkt[a.dst_field] = pkt[a.src_field]
        elif isinstance(a, parser.NXActionUnknown) and a.subtype == openflow.NXAST_CHECK_PKT_LARGER:
            length, bit, header = struct.unpack_from("!HHI", a.data)
            reg = f"reg{(header >> 9) & 0x7F}"
            larger = pkt.get("len", 0) > length  # a question's packet has no length unless it says one
            pkt[reg] = (_as_int(pkt.get(reg, 0)) & ~(1 << bit)) | (larger << bit)
        elif isinstance(a, parser.OFPActionDecNwTtl):
            if pkt.get("ttl", 64) <= 1:
                return _STOP
            pkt["ttl"] = pkt.get("ttl", 64) - 1
        elif isinstance(a, parser.OFPActionOutput):
            port = {P.OFPP_IN_PORT: pkt["in_port"], ofp.OFPP_CONTROLLER: CONTROLLER}.get(a.port, a.port)
            out.append((port, dict(pkt)))
        elif isinstance(a, parser.NXActionOutputReg):
            out.append((pkt[a.src], dict(pkt)))
        elif isinstance(a, parser.NXActionMultipath):  # a stable hash of the 5-tuple (not OVS's own numbers)
            n = a.max_link + 1
            pkt[a.dst] = max(range(n), key=lambda i: zlib.crc32(repr((self._key(pkt), i)).encode()))
        elif isinstance(a, parser.NXActionCT):
            self._ct(pkt, a.zone_ofs_nbits, bool(a.flags & 1), a.actions)
            if a.recirc_table != NO_RECIRC:
                return a.recirc_table
        else:
            raise NotImplementedError(f"action {a!r} is not modelled")
        return None

    @staticmethod
    def _key(pkt: dict) -> tuple:
        proto = pkt.get("ip_proto", 0)
        sport = pkt.get("tcp_src", pkt.get("udp_src", pkt.get("icmp_id", 0)))
        dport = pkt.get("tcp_dst", pkt.get("udp_dst", pkt.get("icmp_id", 0)))
        v6 = "ipv6_src" in pkt
        return (pkt["ipv6_src" if v6 else "ipv4_src"], pkt["ipv6_dst" if v6 else "ipv4_dst"], proto, sport, dport)

    @staticmethod
    def _l4(pkt: dict) -> str:
        return {6: "tcp", 17: "udp"}.get(pkt.get("ip_proto", 0), "")

    def _ct(self, pkt: dict, zone: int, commit: bool, exec_: Iterable) -> None:
        """Both directions of a committed connection are found (the reply's tuple is the translated one); NAT
        translates the original direction's destination and the reply's source."""
        table = self.conntrack.setdefault(zone, {})
        key = self._key(pkt)
        nat = next((a for a in exec_ if isinstance(a, parser.NXActionNAT)), None)
        c, reply = table.get(key, (None, False))
        if c is not None and reply:
            c.replied = True
        state = (P.CT_EST | P.CT_RPL) if reply else (P.CT_EST if c is not None and c.replied else P.CT_NEW)
        if commit and c is None:
            c = Conn()
            table[key] = (c, False)
            rdst = (key[1], key[4])
            if nat is not None and nat.flags & 2:
                c.dnat, c.orig = (nat.range_ipv4_min, nat.range_proto_min), rdst
                rdst = c.dnat
            table[(rdst[0], key[0], key[2], rdst[1], key[3])] = (c, True)
        if commit:
            for load in (a for a in exec_ if isinstance(a, parser.NXActionRegLoad)):
                ofs, nbits = load.ofs_nbits >> 6, (load.ofs_nbits & 0x3F) + 1
                mask = ((1 << nbits) - 1) << ofs
                if load.dst == "ct_mark":
                    c.mark = (c.mark & ~mask) | (load.value << ofs)
                else:
                    c.label = (c.label & ~mask) | (load.value << ofs)
        if nat is not None and c is not None and c.dnat is not None:
            ip, port = c.orig if reply else c.dnat
            side = "src" if reply else "dst"
            pkt[f"ipv4_{side}"] = ip
            if self._l4(pkt):
                pkt[f"{self._l4(pkt)}_{side}"] = port
        pkt["ct_state"] = state | P.CT_TRK
        pkt["ct_mark"] = c.mark if c else 0
        pkt["ct_label"] = c.label if c else 0


_STOP = object()
