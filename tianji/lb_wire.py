"""The load balancers as vSwitches take them (part of the southbound contract, `tianji.southbound`, which
re-exports them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tianji.wire import Wire


class LbBackendInfo(Wire):
    """A member as the vSwitch next to it translates to it: VIP:listener port -> ip:port (port: its MAC picks it),
    and probes it (from its subnet's gateway address)."""

    port_id: str
    ip: str
    mac: str
    port: int
    member_id: str = ""
    gateway_ip: str = ""


class LbMonitorInfo(Wire):
    type: Literal["tcp", "http", "udp-connect"]
    interval_s: float
    timeout_s: float
    rise: int
    fall: int
    http_method: str | None = None
    url_path: str | None = None
    expected_codes: str | None = None


class LbListenerInfo(Wire):
    protocol: Literal["tcp", "udp"]
    port: int
    backends: list[LbBackendInfo] = Field(default_factory=list)
    monitor: LbMonitorInfo | None = None  # the pool's health monitor: the members' hosts probe them


class LbVipInfo(Wire):
    """A load balancer as vSwitches see it: its VIP (answered ARP for), the instances a flow to it is hashed over,
    and per listener the members, which the hosts holding them DNAT to."""

    id: str
    vip: str
    mac: str
    listeners: list[LbListenerInfo] = Field(default_factory=list)
    instance_vteps: list[str] = Field(default_factory=list)
    eip_home_vtep: str | None = None  # replies to the internet go to the instance homing the VIP's EIP
