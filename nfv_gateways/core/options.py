"""What an instance is started with (`tianji gateway run`'s flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nfv_gateways.core.edge import EdgeSpec
from tianji.tls import ClientTls

FASTPATHS = ("auto", "dpdk", "xdp", "packet", "python")  # auto: the best native backend that starts


@dataclass
class GatewayOptions:
    name: str
    controller: str
    token: str
    underlay_if: str
    vtep_ip: str
    external_if: str
    fastpath: str = "auto"
    state_dir: Path = field(default_factory=lambda: Path("/run/tianji"))
    metrics_port: int = 9477  # Prometheus text on 127.0.0.1 (in the gateway host's namespace)
    config_file: Path | None = None  # standalone: a fixed GatewayConfig instead of the controller (benchmarks, labs)
    macs: tuple[str, str] | None = None  # (underlay, external) instead of reading the interfaces (tests)
    # a beat this often (None: as often as each beat's answer asks, a fifth of TIANJI_GATEWAY_DOWN_AFTER: 0.4 s by
    # default, 0.1 s on the emulated cluster); failover takes that silence, a liveness tick, and the propagation
    beat_interval: float | None = None
    nat_mappings: int = 1 << 18  # the NAT's mapping table in C: its slots (a power of two; 3/4 are ever used)
    # the load balancer's connection table: its slots (a power of two; 3/4 of them are ever used) and the rate of
    # new entries it takes (a token bucket holding a tenth of a second's worth): above it, Maglev alone decides
    lb_connections: int = 1 << 20
    lb_new_per_s: float = 100_000.0
    edge: EdgeSpec | None = None  # an edge router to announce our addresses to (BGP), and our way off the segment
    tls: ClientTls | None = None  # how the controller is verified, and this host's certificate
    handoff_mtu: int = 1500  # role private-line: the customers' side (bigger: fragmented, or refused with DF)


__all__ = ["FASTPATHS", "GatewayOptions"]
