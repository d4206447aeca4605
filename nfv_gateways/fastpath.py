"""The native NAT fast path (nfv_gateways/native/nat_fp.c) behind ctypes, with the Python reference as its slow path.

`FastNat` has NatTable's interface. Established mappings are translated in C (TCP handshake and teardown
included: C keeps the established/closing bits, merged back here); on a miss (new flow, new peer, static EIP,
DNAT, ICMP error, hairpin, anything malformed) the packet goes to the Python reference, which
decides exactly as it would alone, and the resulting mapping is pushed into the C table. New flows therefore cost
one Python call each (tens of microseconds); established ones never reach Python.

The library is compiled on the target machine (`build()`, run by `make setup`); nothing prebuilt is shipped.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections import Counter
from pathlib import Path

from nfv_gateways.nat import NatConfig, NatTable, Verdict
from nfv_gateways.packet import PROTO_ICMP, l4_ports, parse_ip4

SRC = Path(__file__).parent / "native" / "nat_fp.c"
LIB = Path(__file__).parent / "native" / "_nat_fp.so"
MISS, OUT, IN = 0, 1, 2
MAX_PEERS = 4


class FastPathUnavailable(RuntimeError):
    pass


def carray(ctype: type, values: list[int]) -> ctypes.Array:
    """A C array of these values (never empty: C gets a valid pointer and the count says how many count)."""
    return (ctype * max(len(values), 1))(*values)


def build(force: bool = False) -> Path:
    """Compile the fast path for this machine (gcc -O2), if it is missing or older than its source."""
    if LIB.exists() and not force and LIB.stat().st_mtime >= SRC.stat().st_mtime:
        return LIB
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise FastPathUnavailable("no C compiler: apt-get install gcc (or run `make setup`)")
    tmp = LIB.with_suffix(".tmp.so")
    r = subprocess.run([cc, "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-o", str(tmp), str(SRC)],
                       capture_output=True, text=True)
    if r.returncode:
        raise FastPathUnavailable(f"building {SRC.name} failed: {r.stderr.strip()}")
    tmp.replace(LIB)
    return LIB


def load() -> ctypes.CDLL:
    return declare(ctypes.CDLL(str(build())))


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of the NAT table functions (in _nat_fp.so and in every data-plane build, which includes it)."""
    u32, u16, u8, dbl, ptr = ctypes.c_uint32, ctypes.c_uint16, ctypes.c_uint8, ctypes.c_double, ctypes.c_void_p
    lib.nat_create.restype = ptr
    lib.nat_create.argtypes = [u32]
    lib.nat_destroy.argtypes = [ptr]
    lib.nat_set_served.argtypes = [ptr, ctypes.POINTER(u32), u32]
    lib.nat_set_mtu.argtypes = [ptr, u32]
    p32, p16, p8 = ctypes.POINTER(u32), ctypes.POINTER(u16), ctypes.POINTER(u8)
    lib.nat_set_rules.argtypes = [ptr, p32, p32, p32, u32, p32, p16, p8, p32, p32, p16, u32]
    lib.nat_put.argtypes = [ptr, u32, u32, u16, u8, u32, u16, u8, u8, ctypes.POINTER(u32), ctypes.POINTER(u16), u8,
                            dbl]
    lib.nat_state.argtypes = [ptr, u32, u32, u16, u8, ctypes.POINTER(u8)]
    lib.nat_state.restype = dbl
    lib.nat_del.argtypes = [ptr, u32, u32, u16, u8]
    lib.nat_last.argtypes = [ptr, u32, u32, u16, u8]
    lib.nat_last.restype = dbl
    lib.nat_outbound.argtypes = [ptr, u32, ctypes.c_char_p, u32, dbl]
    lib.nat_inbound.argtypes = [ptr, ctypes.c_char_p, u32, dbl, ctypes.POINTER(u32), ctypes.POINTER(u32)]
    lib.nat_stats.argtypes = [ptr, ctypes.POINTER(ctypes.c_uint64)]
    return lib


class FastNat:
    """NatTable's interface; C for established flows, the Python reference for everything else."""

    def __init__(self, config: NatConfig, capacity_pow2: int = 1 << 16, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib if lib is not None else load()
        self.h = self.lib.nat_create(capacity_pow2)
        if not self.h:
            raise FastPathUnavailable("nat_create failed (out of memory?)")
        self.ref = NatTable(config)
        self._push_config()

    def close(self) -> None:
        if self.h:
            self.lib.nat_destroy(self.h)
            self.h = None

    def __del__(self) -> None:
        self.close()

    @property
    def counters(self) -> Counter[str]:
        """The reference's counters plus the packets the fast path translated on its own."""
        c = Counter(self.ref.counters)
        st = self.stats()
        c["out"] += st["fast_out"]
        c["in"] += st["fast_in"]
        return +c

    def _push_config(self) -> None:
        served = sorted(self.ref.served)
        self.lib.nat_set_served(self.h, carray(ctypes.c_uint32, served), len(served))
        self.lib.nat_set_mtu(self.h, self.ref.config.mtu)
        st = self.ref.config.static
        dn = self.ref.config.dnat  # (eip, proto, ext port, vni, ip, port)
        u32, u16, u8 = ctypes.c_uint32, ctypes.c_uint16, ctypes.c_uint8
        r = self.lib.nat_set_rules(self.h, carray(u32, [s[0] for s in st]), carray(u32, [s[1] for s in st]),
                                   carray(u32, [s[2] for s in st]), len(st), carray(u32, [d[0] for d in dn]),
                                   carray(u16, [d[2] for d in dn]), carray(u8, [d[1] for d in dn]),
                                   carray(u32, [d[3] for d in dn]), carray(u32, [d[4] for d in dn]),
                                   carray(u16, [d[5] for d in dn]), len(dn))
        if r != 0:
            raise FastPathUnavailable("nat_set_rules failed (out of memory)")

    def update_config(self, config: NatConfig) -> list[tuple[int, int, int, int]]:
        gone = self.ref.update_config(config)
        for key in gone:
            self.lib.nat_del(self.h, *key)
        self._push_config()
        return gone

    def _push(self, key: tuple[int, int, int, int]) -> None:
        m = self.ref.by_inside.get(key)
        if m is None:
            return
        peers = sorted(m.peers)[:MAX_PEERS]
        ips = (ctypes.c_uint32 * MAX_PEERS)(*[p[0] for p in peers])
        ports = (ctypes.c_uint16 * MAX_PEERS)(*[p[1] for p in peers])
        self.lib.nat_put(self.h, m.vni, m.ip, m.port, m.proto, m.eip, m.eport, int(m.tcp_established),
                         int(m.tcp_closing), ips, ports, len(peers), m.last)

    def sync(self) -> None:
        """Pull the last-seen times the fast path kept back into the reference (before expiry, for stats)."""
        for key in self.ref.by_inside:
            self.sync_one(key)

    def expire(self, now: float) -> int:
        self.sync()
        before = set(self.ref.by_inside)
        n = self.ref.expire(now)
        for key in before - set(self.ref.by_inside):
            self.lib.nat_del(self.h, *key)
        return n

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        raw = (ctypes.c_char * len(buf)).from_buffer(buf)
        done = self.lib.nat_outbound(self.h, vni, raw, len(buf), now) == OUT
        del raw  # the reference may replace the packet (time exceeded): no view of it may outlive the call
        if done:
            return Verdict("out")
        key = _inside_key(vni, buf)
        self.sync_one(key)
        v = self.ref.outbound(vni, buf, now)
        if key is not None:
            self._push(key)
        return v

    def inbound(self, buf: bytearray, now: float) -> Verdict | None:
        raw = (ctypes.c_char * len(buf)).from_buffer(buf)
        vni, ip = ctypes.c_uint32(), ctypes.c_uint32()
        done = self.lib.nat_inbound(self.h, raw, len(buf), now, ctypes.byref(vni), ctypes.byref(ip)) == IN
        del raw
        if done:
            return Verdict("in", vni.value, ip.value)
        key = _outside_key(buf)
        m = self.ref.by_outside.get(key) if key else None
        if m is not None:
            self.sync_one((m.vni, m.ip, m.port, m.proto))
        v = self.ref.inbound(buf, now)
        if m is not None:
            self._push((m.vni, m.ip, m.port, m.proto))
        return v

    def sync_one(self, key: tuple[int, int, int, int] | None) -> None:
        """Merge what the fast path saw into the reference: last-seen time, TCP established/closing (monotonic)."""
        if key is not None and (m := self.ref.by_inside.get(key)) is not None:
            bits = ctypes.c_uint8()
            last = self.lib.nat_state(self.h, *key, ctypes.byref(bits))
            if last > m.last:
                m.last = last
            if last >= 0:
                m.tcp_established |= bool(bits.value & 1)
                m.tcp_closing |= bool(bits.value & 2)

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * 3)()
        self.lib.nat_stats(self.h, out)
        return {"fast_out": out[0], "fast_in": out[1], "slow": out[2]}


def _inside_key(vni: int, buf: bytes | bytearray) -> tuple[int, int, int, int] | None:
    ip = parse_ip4(buf)
    if ip is None or ip.is_fragment:
        return None
    ports = l4_ports(buf, ip)
    return None if ports is None else (vni, ip.src, ports[0], ip.proto)


def _outside_key(buf: bytes | bytearray) -> tuple[int, int, int] | None:
    ip = parse_ip4(buf)
    if ip is None or ip.is_fragment:
        return None
    ports = l4_ports(buf, ip)
    if ports is None:
        return None
    return (ip.dst, ports[0] if ip.proto == PROTO_ICMP else ports[1], ip.proto)


__all__ = ["FastNat", "FastPathUnavailable", "build", "carray", "declare", "load"]
