"""An in-memory model of OpenFlow tables and conntrack, for fast unit tests of the flow computation.

A packet (a dict of header fields) goes in; the model walks the tables the way Open vSwitch would and
returns what comes out: (port, packet) pairs, and packet-ins for the controller. It models exactly the
match fields and actions `flows.py` uses, and raises on anything else so a new action cannot go untested.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vswitch_agent import pipeline as P
from vswitch_agent.flows import Flow

CONTROLLER = "controller"


def _as_int(v: Any) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.count(".") == 3:
        return int(ipaddress.IPv4Address(v))
    if isinstance(v, str) and v.count(":") == 5:
        return int(v.replace(":", ""), 16)
    raise TypeError(f"cannot compare {v!r}")


def field_matches(pkt: dict, name: str, want: Any) -> bool:
    have = pkt.get(name)
    if name == "ct_state" and have is None:
        have = 0
    if have is None:
        return False
    if isinstance(want, tuple):
        value, mask = want
        return _as_int(have) & _as_int(mask) == _as_int(value) & _as_int(mask)
    return _as_int(have) == _as_int(want)


@dataclass
class Conn:
    mark: int = 0
    label: int = 0
    replied: bool = False


@dataclass
class Switch:
    flows: set[Flow]
    conntrack: dict[int, dict[tuple, Conn]] = field(default_factory=dict)
    hits: dict[Flow, int] = field(default_factory=dict)

    def tables(self) -> dict[int, list[Flow]]:
        out: dict[int, list[Flow]] = {}
        for f in sorted(self.flows, key=lambda f: -f.priority):  # stable: equal priorities stay together
            out.setdefault(f.table, []).append(f)
        return out

    def inject(self, pkt: dict) -> list[tuple[Any, dict]]:
        pkt = dict(pkt)
        pkt.setdefault("metadata", 0)
        for r in range(8):
            pkt.setdefault(f"reg{r}", 0)
        return self._run(pkt, 0, self.tables(), depth=0)

    def _lookup(self, table: list[Flow], pkt: dict) -> Flow | None:
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
                assert len(plain) == 1, f"overlapping flows of equal priority: {plain}"
                return plain[0]
            clauses: dict[int, set[int]] = {}
            n_of: dict[int, int] = {}
            for f in hits:
                for _, cid, k, n in f.actions:
                    clauses.setdefault(cid, set()).add(k)
                    n_of[cid] = n
            for cid in sorted(c for c, ks in clauses.items() if len(ks) == n_of[c]):
                probe = pkt | {"conj_id": cid}
                for f in level:
                    if "conj_id" in f.m() and all(field_matches(probe, k, v) for k, v in f.match):
                        return f
        return None

    def _run(self, pkt: dict, table_id: int, tables: dict[int, list[Flow]], depth: int) -> list[tuple[Any, dict]]:
        out: list[tuple[Any, dict]] = []
        if depth > 32:
            raise RuntimeError("pipeline loop")
        f = self._lookup(tables.get(table_id, []), pkt)
        if f is None:
            return out
        self.hits[f] = self.hits.get(f, 0) + 1
        for a in f.actions:
            op = a[0]
            if op == "goto":
                assert a[1] > table_id, "goto must move forward"
                return out + self._run(pkt, a[1], tables, depth + 1)
            if op == "set":
                pkt[a[1]] = a[2]
            elif op == "load":
                _, name, ofs, nbits, value = a
                mask = ((1 << nbits) - 1) << ofs
                cur = _as_int(pkt.get(name, 0))
                pkt[name] = (cur & ~mask) | ((value << ofs) & mask)
            elif op == "move":
                _, src, dst, _nbits = a
                pkt[dst] = pkt[src]
            elif op == "dec_ttl":
                if pkt.get("ttl", 64) <= 1:
                    return out
                pkt["ttl"] = pkt.get("ttl", 64) - 1
            elif op == "output":
                port = pkt["in_port"] if a[1] == P.OFPP_IN_PORT else a[1]
                out.append((port, dict(pkt)))
            elif op == "output_reg":
                out.append((pkt[a[1]], dict(pkt)))
            elif op == "controller":
                out.append((CONTROLLER, dict(pkt)))
            elif op == "ct":
                _, commit, zone, table, exec_ = a
                self._ct(pkt, zone, commit, exec_)
                if table is not None:
                    return out + self._run(pkt, table, tables, depth + 1)
            else:
                raise NotImplementedError(f"action {a!r} is not modelled")
        return out

    @staticmethod
    def _key(pkt: dict) -> tuple:
        proto = pkt.get("ip_proto", 0)
        sport = pkt.get("tcp_src", pkt.get("udp_src", pkt.get("icmp_id", 0)))
        dport = pkt.get("tcp_dst", pkt.get("udp_dst", pkt.get("icmp_id", 0)))
        return (pkt["ipv4_src"], pkt["ipv4_dst"], proto, sport, dport)

    def _ct(self, pkt: dict, zone: int, commit: bool, exec_: Iterable) -> None:
        table = self.conntrack.setdefault(zone, {})
        key = self._key(pkt)
        rkey = (key[1], key[0], key[2], key[4], key[3])
        if key in table:
            c, state = table[key], (P.CT_EST if table[key].replied else P.CT_NEW)
        elif rkey in table:
            c = table[rkey]
            c.replied = True
            state = P.CT_EST | P.CT_RPL
        else:
            c, state = None, P.CT_NEW
        if commit:
            if c is None:
                c = table[key] = Conn()
            for _, name, ofs, nbits, value in exec_:
                mask = ((1 << nbits) - 1) << ofs
                if name == "ct_mark":
                    c.mark = (c.mark & ~mask) | (value << ofs)
                else:
                    c.label = (c.label & ~mask) | (value << ofs)
        pkt["ct_state"] = state | P.CT_TRK
        pkt["ct_mark"] = c.mark if c else 0
        pkt["ct_label"] = c.label if c else 0
