"""The gateway's native data plane (nfv_gateways/native/, interface in include/tj_dp.h) behind ctypes.

One library per packet-I/O backend this machine supports, built by native/Makefile:

    dpdk    DPDK ethdev over net_af_xdp vdevs (`pkg-config libdpdk`), the loop on a worker lcore
    xdp     AF_XDP sockets through libxdp (`pkg-config libxdp libbpf`), behind the XDP flow cache (_tj_xdp.o, clang):
            a stage hands it the established flows it carries, and the kernel repeats the rewrite (include/tj_xdp.h)
    packet  AF_PACKET sockets, a mapped TPACKET_V2 receive ring and sendmmsg bursts (always)

Every library also carries every role's stage (nat_stage.c, lb_stage.c): a role makes its table on the data
plane's library and hands it to the loop (`use_nat`, `use_lb`), so the loop and the role's Python slow path share
one table. Until then the loop punts every frame.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

from nfv_gateways.native.api import NATIVE, FastPathUnavailable, carray, constants, counter_names, structure
from nfv_gateways.native.api import build as build_library
from nfv_gateways.native.api import load as load_library

log = logging.getLogger("tianji.gateway.dataplane")
BACKENDS = ("dpdk", "xdp", "packet")  # best first: what `--fastpath auto` tries
# the instance's port numbering, also used without any C; a library built otherwise is refused at load
UL, EXT, PUNT_TRANSLATED = 0, 1, 0x82


def lib_path(backend: str) -> str:
    return str(NATIVE / f"_gw_{backend}.so")


def build(backend: str) -> str:
    """Build the data plane for one backend on this machine; FastPathUnavailable says what is missing."""
    return str(build_library(f"_gw_{backend}.so"))


def build_all() -> dict[str, str]:
    """Build every backend this machine supports; returns backend -> library path or the reason it is missing."""
    result = {}
    for b in BACKENDS:
        try:
            result[b] = build(b)
        except FastPathUnavailable as e:
            result[b] = f"unavailable: {e}"
    return result


def load(backend: str) -> ctypes.CDLL:
    # without a bpffs (network namespaces rarely have one) libxdp loads a single XDP program: say so only once here
    os.environ.setdefault("LIBXDP_SKIP_DISPATCHER", "1")
    lib = load_library(f"_gw_{backend}.so")
    k = constants(lib)
    if (k["DP_UL"], k["DP_EXT"], k["DP_PUNT_TRANSLATED"]) != (UL, EXT, PUNT_TRANSLATED):
        raise FastPathUnavailable(f"{backend}: the library numbers its ports otherwise than dataplane.py")
    return lib


def link_mtu(ifname: str) -> int:
    """An interface's MTU in this network namespace (1500 if it cannot be read)."""
    try:
        return int(Path(f"/sys/class/net/{ifname}/mtu").read_text())
    except (OSError, ValueError):
        return 1500


def xdp_cache() -> str:
    """The XDP flow cache's object for the xdp backend, or "" (TIANJI_XDP_CACHE=0: every frame to the loop)."""
    obj = NATIVE / "_tj_xdp.o"
    return str(obj) if os.environ.get("TIANJI_XDP_CACHE", "1") != "0" and obj.exists() else ""


def eal_args(name: str, ul_if: str, ext_if: str) -> str:
    """EAL without hugepages or PCI, as measured on these machines; AF_XDP vdevs on the gateway's two interfaces."""
    cores = sorted(os.sched_getaffinity(0))
    lcores = f"{cores[0]},{cores[-1]}" if len(cores) > 1 else f"{cores[0]}"
    return (f"-l {lcores} --main-lcore {cores[0]} --no-huge -m 256 --no-shconf --no-pci --no-telemetry "
            f"--log-level *:warning --file-prefix tj-{name}-{os.getpid()} "
            f"--vdev=net_af_xdp0,iface={ul_if},start_queue=0,queue_count=1,busy_budget=0 "
            f"--vdev=net_af_xdp1,iface={ext_if},start_queue=0,queue_count=1,busy_budget=0")


class NativeDataPlane:
    """Both ports of a gateway instance in C. Python drains the punt ring, answers through `inject`."""

    def __init__(self, backend: str, name: str, ul_if: str, ext_if: str, ul_mac: bytes, ext_mac: bytes,
                 vtep: int, cache_lru: int = 0) -> None:
        self.backend = backend
        self.lib = load("packet" if backend == "mem" else backend)  # "mem" (tests) is built into every library
        k = constants(self.lib)
        if backend == "dpdk" and (mtu := link_mtu(ul_if)) + 14 > k["DP_DPDK_MAX_FRAME"]:
            raise FastPathUnavailable(f"dpdk: the af_xdp PMD carries frames up to {k['DP_DPDK_MAX_FRAME']} bytes and "
                                      f"{ul_if}'s MTU is {mtu}")
        self.crossed: Counter[str] = Counter()  # configuration calls into C, and their bytes
        self.h = self.lib.dp_create(ul_mac, ext_mac, vtep)
        if not self.h:
            raise FastPathUnavailable("dp_create failed (out of memory?)")
        self.blinded: list[str] = []
        if backend == "packet":  # the AF_PACKET taps still hand every frame to the kernel: keep it out of the way
            self._blind_kernel(ul_if, ext_if)
        self.cache = xdp_cache() if backend == "xdp" else ""
        self.ifaces, self.macs = (ul_if, ext_if), (ul_mac, ext_mac)
        # a role whose stage hands flows to the XDP cache says so (the receive work is then the cache's, on the
        # loop's core); for the others it is the AF_XDP copy, best left on the transmitting core, off the loop's
        self.cache_in_use = False
        arg = eal_args(name, ul_if, ext_if) if backend == "dpdk" else self.cache
        self.lib.dp_set_cache_lru(self.h, cache_lru)  # a stateless stage's cache ages its flows out itself
        if self.lib.dp_open(self.h, backend.encode(), ul_if.encode(), ext_if.encode(), arg.encode()) != 0:
            err = self.lib.dp_error(self.h).decode()
            self.lib.dp_close(self.h)
            self._unblind()
            raise FastPathUnavailable(f"{backend}: {err}")
        self._slot, self._burst = k["DP_SLOT"], k["DP_BURST"]
        self._bufs = ctypes.create_string_buffer(self._slot * self._burst)
        self._lens = (ctypes.c_uint32 * self._burst)()
        self._ports = (ctypes.c_uint8 * self._burst)()
        self._counters = counter_names(self.lib)

    def _blind_kernel(self, *ifaces: str) -> None:
        """nftables netdev ingress drop: AF_PACKET taps see frames before it, the kernel's stack never does."""
        subprocess.run(["nft", "delete", "table", "netdev", "tianji_gw"], capture_output=True)
        cmds = [["add", "table", "netdev", "tianji_gw"]]
        for i, ifname in enumerate(ifaces):
            cmds.append(["add", "chain", "netdev", "tianji_gw", f"in{i}",
                         f"{{ type filter hook ingress device {ifname} priority 0 ; policy drop ; }}"])
        for c in cmds:
            r = subprocess.run(["nft", *c], capture_output=True, text=True)
            if r.returncode:
                log.warning("nft %s: %s (the kernel will also see the gateway's frames)", " ".join(c),
                            r.stderr.strip())
                return
        self.blinded = list(ifaces)

    def _unblind(self) -> None:
        if self.blinded:
            subprocess.run(["nft", "delete", "table", "netdev", "tianji_gw"], capture_output=True)
            self.blinded = []

    def use_nat(self, nat_handle: int) -> None:
        """The loop runs the NAT stage over this table (made on `self.lib`)."""
        self.lib.dp_use_nat(self.h, nat_handle)

    def use_lb(self, lb_handle: int) -> None:
        """The loop runs the load balancer's stage over this connection table (made on `self.lib`)."""
        self.lib.dp_use_lb(self.h, lb_handle)

    def start(self, own_core: bool = False) -> None:
        """Start the packet loop; `own_core`: on the last core this process may use, the calling thread and the
        threads it starts from now on moving to the others (a DPDK lcore or an OVS PMD thread has its core so)."""
        cpu = -1
        if own_core and len(cpus := sorted(os.sched_getaffinity(0))) > 1:
            os.sched_setaffinity(0, cpus[:-1])
            cpu = cpus[-1]
        if self.lib.dp_start(self.h, cpu) != 0:
            raise FastPathUnavailable(f"{self.backend}: {self.lib.dp_error(self.h).decode()}")
        if cpu >= 0 and self.cache and self.cache_in_use:
            self._steer_receive(cpu)

    def _steer_receive(self, cpu: int) -> None:
        """The ports' receive work (RPS) on the loop's core: the XDP flow cache, attached in generic mode, runs
        there, as the kernel's own forwarding would run where a gateway host pins its NIC's interrupts; left
        where it was (the transmitting core: a veth) the cache's work lands on the tenants' or the service's core."""
        for ifname, mac in zip(self.ifaces, self.macs, strict=True):
            sysfs = Path(f"/sys/class/net/{ifname}")
            try:  # a sysfs mounted in another namespace (a Mininet host shares the root's) shows other interfaces
                if bytes.fromhex(sysfs.joinpath("address").read_text().strip().replace(":", "")) != mac:
                    log.info("receive steering on %s: this sysfs shows another namespace's interface", ifname)
                    continue
                sysfs.joinpath("queues/rx-0/rps_cpus").write_text(f"{1 << cpu:x}\n")
            except OSError as e:
                log.warning("receive steering on %s: %s (the XDP cache runs where frames arrive)", ifname, e)

    def close(self) -> None:
        if self.h:
            self.lib.dp_close(self.h)
            self.h = None
            self._unblind()

    # Every call takes the handle once: close() may run meanwhile in another thread (an instance stopping while its
    # status and punt threads still run). The C struct outlives dp_close, so a handle taken before it stays valid;
    # after it, the calls below do nothing (NULL would crash the process).
    def punt(self, timeout_ms: int = 100) -> list[tuple[int, bytes]]:
        """Frames the loop did not handle, oldest first: (port, frame). Waits up to timeout_ms (GIL released)."""
        if (h := self.h) is None:
            time.sleep(timeout_ms / 1000)
            return []
        n = self.lib.dp_punt(h, self._bufs, self._lens, self._ports, self._burst, timeout_ms)
        return self._frames(n)

    def _frames(self, n: int) -> list[tuple[int, bytes]]:
        raw, slot = self._bufs.raw, self._slot
        return [(self._ports[i], raw[i * slot:i * slot + self._lens[i]]) for i in range(max(n, 0))]

    # --- the memory backend (tests): push frames in, run one poll, pull what was transmitted ---------------------
    def mem_push(self, port: int, frame: bytes) -> None:
        if self.lib.dp_mem_push(self.h, port, frame, len(frame)) != 0:
            raise ValueError("mem backend: queue full, frame too long or not the mem backend")

    def poll(self) -> int:
        return self.lib.dp_poll(self.h)

    def mem_pop(self) -> list[tuple[int, bytes]]:
        return self._frames(self.lib.dp_mem_pop(self.h, self._bufs, self._lens, self._ports, self._burst))

    def inject(self, port: int, frame: bytes) -> bool:
        return (h := self.h) is not None and self.lib.dp_inject(h, port, frame, len(frame)) == 0

    def set_vteps(self, vteps: list[int]) -> None:
        """The VTEPs tenant traffic may come from, replaced whole."""
        if (h := self.h) is not None and self.lib.dp_set_vteps(h, carray(ctypes.c_uint32, vteps), len(vteps)) != 0:
            raise FastPathUnavailable("dp_set_vteps failed (out of memory)")
        self.crossed["calls"] += 1
        self.crossed["bytes"] += 4 * len(vteps)

    def set_vpc(self, vni: int, router_mac: bytes, endpoints: list[tuple[int, int, bytes]]) -> None:
        """One VPC's forwarding: its router MAC and endpoints (IP, VTEP, MAC), replacing what it had."""
        ep_t = structure("tj_endpoint_t")
        eps = (ep_t * max(len(endpoints), 1))(*[ep_t(ip, vtep, (ctypes.c_uint8 * 6)(*mac))
                                                  for ip, vtep, mac in endpoints])
        if (h := self.h) is None:
            return  # closed: a config arriving while the instance stops
        if self.lib.dp_set_vpc(h, vni, router_mac, eps, len(endpoints)) != 0:
            raise FastPathUnavailable("dp_set_vpc failed (out of memory)")
        self.crossed["calls"] += 1
        self.crossed["bytes"] += 6 + len(endpoints) * ctypes.sizeof(ep_t)

    def remove_vpc(self, vni: int) -> None:
        if (h := self.h) is not None:
            self.lib.dp_remove_vpc(h, vni)
            self.crossed["calls"] += 1

    def held(self) -> dict[str, int]:
        """What the data plane holds: VPCs and endpoints."""
        h = self.h
        return {"vpcs": self.lib.dp_vpc_count(h), "endpoints": self.lib.dp_endpoint_count(h)} if h else {}

    def set_neigh(self, port: int, ip: int, mac: bytes) -> None:
        if (h := self.h) is not None and self.lib.dp_set_neigh(h, port, ip, mac) != 0:
            log.warning("neighbour table of port %d is full: %s stays with the slow path", port, ip)

    def set_ext_route(self, net: int, length: int, gw: int) -> None:
        if (h := self.h) is not None:
            self.lib.dp_set_ext_route(h, net, length, gw)
            self.crossed["calls"] += 1

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * len(self._counters))()
        if (h := self.h) is not None:
            self.lib.dp_stats(h, out)
        return {k: out[i] for i, k in enumerate(self._counters)}


__all__ = ["BACKENDS", "NativeDataPlane", "build", "build_all", "lib_path"]
