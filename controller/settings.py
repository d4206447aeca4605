"""Controller settings: one place for every knob, read from TIANJI_* environment variables and the CLI, and
validated at start: a bad value stops the controller with a message naming the variable, before it serves."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

VNI_LIMIT = 16_777_215  # 24 bits

DEFAULT_QUOTAS = {"vpcs": 50, "subnets": 500, "ports": 10_000, "security_groups": 500,
                  "security_group_rules": 5_000, "eips": 50, "nat_gateways": 20, "peerings": 100,
                  "load_balancers": 20, "tokens": 20, "private_lines": 10,
                  "service_endpoints": 50}


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/tianji")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tianji"


class SettingsError(SystemExit):
    """A setting the controller cannot start with; the message names the environment variable."""


class Settings(BaseSettings):
    # a variable set to "" is unset (TIANJI_DATABASE_URL= is the SQLite default, never a path named "")
    model_config = SettingsConfigDict(env_prefix="TIANJI_", extra="ignore", validate_assignment=True,
                                      env_ignore_empty=True)

    state_dir: Path = Field(default_factory=default_state_dir)
    database_url: str | None = None
    vni_range: str = Field(f"1000..{VNI_LIMIT}", description="LOW..HIGH, within 1..16777215")
    # a freed VNI is handed out again only after this long (an agent may still hold the old VPC's flows), and
    # only once the allocator has gone round the whole range (allocation moves forward, wrapping)
    vni_quarantine_s: float = Field(3600.0, ge=0)
    # a released EIP is handed out again within this long only when no other address is free: servers hold its
    # last tenant's connections in TIME_WAIT (up to 2 MSL, 240 s), and the next tenant's from the same ports
    # would be refused (PAWS drops their SYNs)
    eip_quarantine_s: float = Field(240.0, ge=0)
    host_down_after: float = Field(15.0, gt=0)  # seconds of heartbeat silence before a host is marked down
    # gateways beat every 0.1 s; their EIPs move when silent this long. 2 s by default, a margin for a loaded
    # controller (beats queue behind writes); lower it where the controller has room (0.5 s on the emulated
    # cluster, where failover then costs about 0.6 s)
    gateway_down_after: float = Field(2.0, gt=0)
    max_watch_timeout: float = Field(60.0, gt=0)
    # the cloud's side of every private line's BGP sessions (Direct Connect's default Amazon-side ASN)
    private_line_asn: int = Field(64512, ge=1, le=4294967294)
    # VLANs no private line may take on the handoff (1: the native VLAN of most switches, where untagged frames go)
    private_line_reserved_vlans: list[int] = Field(default_factory=lambda: [1])
    # the underlay's MTU (every hypervisor's and gateway's underlay NIC): a VPC's MTU may be up to 50 bytes less
    underlay_mtu: int = Field(1500, ge=1330, le=9216)
    # during a burst of writes (Broadcaster.busy) a woken watch waits this long for more before compiling. Off by
    # default: a watch has one compile in flight, and what lands meanwhile is in the agent's next answer anyway
    watch_coalesce: float = Field(0.0, ge=0)
    eip_pool: str | None = None
    # where the operator's shared services live (their addresses must be inside it; none: anywhere else), and the
    # underlay's networks (no service address may be one of them)
    service_network: str | None = None
    # the endpoints' own addresses on the service network (one each, the source the service sees): inside the
    # service network, apart from the services' addresses; none: endpoints carry no traffic (their names resolve)
    service_source_pool: str | None = None
    underlay_cidrs: list[str] = Field(default_factory=list, description="the underlay's networks (JSON list)")
    ipv6_pools: list[str] = Field(default_factory=lambda: ["fd00:7469::/32"],
                                  description="IPv6 prefixes VPCs' /56s are handed out from (JSON list): unique local "
                                              "by default; global ones for VPCs that reach the internet")
    vpc_public_cidrs: list[str] = Field(default_factory=list,
                                        description="public ranges tenants may use as VPC CIDRs (JSON list)")
    quotas: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_QUOTAS),
                                   description="defaults per tenant (JSON); -1: unlimited")
    rate_limit: float = Field(100.0, ge=0, description="requests a second per tenant (all its tokens together), "
                                                       "per host or orchestrator credential (admin exempt); 0: off")
    rate_burst: int = Field(500, ge=1)
    auth_fail_limit: float = Field(2.0, ge=0, description="failed authentications a second per source address, "
                                                           "and per credential tried; 0: off")
    auth_fail_burst: int = Field(20, ge=1)
    max_body_bytes: int = Field(1 << 20, ge=1024)
    metrics_open: bool = Field(False, description="serve /metrics without a token (a scraper on a trusted network); "
                                                  "else it needs the admin token")
    trusted_proxies: list[str] = Field(default_factory=list,
                                       description="addresses or networks of reverse proxies whose X-Forwarded-For "
                                                   "is believed (JSON list); none by default")
    sqlite_synchronous: str = Field("FULL", pattern="^(FULL|NORMAL|EXTRA)$")
    # HTTPS: the server's certificate and key (PEM); with client_ca, hosts must present a certificate naming them
    # the admin token, in a file the operator names (replicas: each given the same file); none: the first replica
    # makes one in its state directory, and the others accept it (its hash is in the database)
    admin_token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None

    @field_validator("vni_range")
    @classmethod
    def _vni_range(cls, v: str) -> str:
        lo, sep, hi = v.partition("..")
        if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
            raise ValueError(f"{v!r} is not LOW..HIGH (e.g. 1000..16777215)")
        lo_i, hi_i = int(lo), int(hi)
        if not 1 <= lo_i <= hi_i <= VNI_LIMIT:
            raise ValueError(f"{v!r}: need 1 <= LOW <= HIGH <= {VNI_LIMIT}")
        return f"{lo_i}..{hi_i}"

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: list[str]) -> list[str]:
        import ipaddress

        return [str(ipaddress.ip_network(c, strict=False)) for c in v]

    @field_validator("ipv6_pools")
    @classmethod
    def _pools6(cls, v: list[str]) -> list[str]:
        import ipaddress

        nets = [ipaddress.IPv6Network(c, strict=True) for c in v]
        if bad := [str(n) for n in nets if n.prefixlen > 56]:
            raise ValueError(f"an IPv6 pool holds /56s: {', '.join(bad)} is smaller than a /56")
        return [str(n) for n in nets]

    @field_validator("vpc_public_cidrs")
    @classmethod
    def _public(cls, v: list[str]) -> list[str]:
        import ipaddress

        return [str(ipaddress.IPv4Network(c, strict=True)) for c in v]

    @field_validator("underlay_cidrs")
    @classmethod
    def _underlay(cls, v: list[str]) -> list[str]:
        import ipaddress

        return [str(ipaddress.IPv4Network(c, strict=True)) for c in v]

    @field_validator("service_network")
    @classmethod
    def _service_network(cls, v: str | None) -> str | None:
        import ipaddress

        return str(ipaddress.IPv4Network(v, strict=True)) if v else None

    @model_validator(mode="after")
    def _service_network_apart(self) -> Settings:
        """The service network overlaps neither the underlay nor the EIP pool nor tenants' public ranges."""
        import ipaddress

        if self.service_source_pool:
            pool = ipaddress.IPv4Network(self.service_source_pool, strict=True)
            if self.service_network and not pool.subnet_of(ipaddress.IPv4Network(self.service_network)):
                raise ValueError(f"service_source_pool {pool} is not inside service_network {self.service_network}")
        if not self.service_network:
            return self
        net = ipaddress.IPv4Network(self.service_network)
        for what, cidrs in (("the underlay", self.underlay_cidrs), ("the EIP pool", [self.eip_pool] if self.eip_pool
                                                                      else []),
                            ("VPC public CIDRs", self.vpc_public_cidrs)):
            if c := next((c for c in cidrs if net.overlaps(ipaddress.ip_network(c))), None):
                raise ValueError(f"service_network {net} overlaps {what} ({c})")
        return self

    @field_validator("quotas")
    @classmethod
    def _quotas(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = set(v) - set(DEFAULT_QUOTAS)
        if unknown:
            raise ValueError(f"unknown quota(s) {sorted(unknown)}; known: {sorted(DEFAULT_QUOTAS)}")
        if bad := [k for k, n in v.items() if n < -1]:
            raise ValueError(f"quota(s) {bad} below -1")
        return DEFAULT_QUOTAS | v

    @model_validator(mode="after")
    def _tls(self) -> Settings:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: give both (PEM files) or neither")
        if self.client_ca and not self.tls_cert:
            raise ValueError("client_ca needs tls_cert and tls_key: client certificates are verified over TLS")
        for what, f in (("tls_cert", self.tls_cert), ("tls_key", self.tls_key), ("client_ca", self.client_ca)):
            if f is not None and not Path(f).is_file():
                raise ValueError(f"{what}: no such file {f}")
        return self

    @model_validator(mode="after")
    def _paths(self) -> Settings:
        if not isinstance(self.state_dir, Path):
            object.__setattr__(self, "state_dir", Path(self.state_dir))
        return self

    @property
    def vni_min(self) -> int:
        return int(self.vni_range.split("..")[0])

    @property
    def vni_max(self) -> int:
        return int(self.vni_range.split("..")[1])

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """The environment (TIANJI_*), then the overrides that are not None. A bad value: SettingsError naming
        the variable."""
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None and v != ""})
        except ValidationError as e:
            lines = [f"  TIANJI_{'_'.join(str(x) for x in err['loc']).upper()}: {err['msg']}" for err in e.errors()]
            raise SettingsError("tianji: invalid settings:\n" + "\n".join(lines)) from None

    @property
    def url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'tianji.db'}"

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite database's file (None on PostgreSQL, or in memory)."""
        url = make_url(self.url)
        return Path(url.database) if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            else None
