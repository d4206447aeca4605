"""The southbound wire schema: what the controller compiles for one host and the agent reconciles to.

This module is the single definition of the watch API's payload; the controller builds it and the
vSwitch agent (and later the gateways) import it. It depends on pydantic only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

OVERLAY_MTU = 1450  # 1500-byte underlay minus 50 bytes of VXLAN/UDP/IP/Ethernet


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True)


class SubnetInfo(_Wire):
    id: str
    cidr: str
    gateway_ip: str


class RouteInfo(_Wire):
    """One effective route of a VPC. `local` routes stay in the VPC; `peering` routes switch the packet
    to the peer VPC (its VNI) and deliver it directly to the destination host."""

    destination: str
    target_type: Literal["local", "peering", "nat-gateway", "blackhole"]
    target_id: str | None = None
    peer_vpc_id: str | None = None  # for peering targets: the VPC the packet enters
    gateway_vteps: list[str] = Field(default_factory=list)  # for gateway targets: the instances serving it
    # for gateway targets: the instance (VTEP) serving each source-address bucket, bucket = source IP & (len - 1)
    gateway_buckets: list[str] = Field(default_factory=list)
    origin: Literal["implicit", "user"] = "implicit"


class VpcInfo(_Wire):
    id: str
    tenant_id: str
    vni: int
    cidr: str
    router_mac: str
    subnets: list[SubnetInfo] = Field(default_factory=list)
    routes: list[RouteInfo] = Field(default_factory=list)


class PortInfo(_Wire):
    """A port bound to this host."""

    id: str
    vpc_id: str
    subnet_id: str
    mac: str
    ip: str
    security_group_ids: list[str] = Field(default_factory=list)
    eip_home_vtep: str | None = None  # a port with its own EIP sends off-VPC traffic to the instance homing it


class Endpoint(_Wire):
    """Any port this host's ports may reach (same VPC or a peered VPC), local or remote."""

    port_id: str
    vpc_id: str
    vni: int
    ip: str
    mac: str
    host: str
    vtep_ip: str


class SecurityGroupRuleInfo(_Wire):
    id: int
    direction: Literal["ingress", "egress"]
    protocol: Literal["tcp", "udp", "icmp", "any"]
    port_range_min: int | None = None
    port_range_max: int | None = None
    # The remote side resolved to CIDRs: remote_cidr as given, or a remote group's member IPs as /32s.
    remote_cidrs: list[str] = Field(default_factory=list)


class SecurityGroupInfo(_Wire):
    id: str
    vpc_id: str
    rules: list[SecurityGroupRuleInfo] = Field(default_factory=list)


class Vtep(_Wire):
    host: str
    ip: str
    kind: str = "hypervisor"


class HostConfig(_Wire):
    host: str
    revision: int
    vtep_ip: str | None = None
    mtu: int = OVERLAY_MTU
    ports: list[PortInfo] = Field(default_factory=list)
    vpcs: list[VpcInfo] = Field(default_factory=list)  # the VPCs of local ports and the VPCs peered with them
    endpoints: list[Endpoint] = Field(default_factory=list)
    security_groups: list[SecurityGroupInfo] = Field(default_factory=list)
    vteps: list[Vtep] = Field(default_factory=list)  # registered VTEPs: the only tunnel sources accepted


class PortStatusReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ports: dict[str, Literal["UP", "DOWN"]] = Field(default_factory=dict)
    revision_applied: int | None = None


class SnatInfo(_Wire):
    cidr: str
    eips: list[str]


class GatewayVpc(_Wire):
    id: str
    vni: int
    router_mac: str
    snat: list[SnatInfo] = Field(default_factory=list)


class StaticEip(_Wire):
    vni: int
    ip: str
    eip: str


class DnatInfo(_Wire):
    eip: str
    protocol: Literal["tcp", "udp"]
    external_port: int
    vni: int
    ip: str
    internal_port: int


class GatewayConfig(_Wire):
    """What a NAT gateway instance serves: per VNI its SNAT rules, the 1:1 EIPs, DNAT rules, and where every
    port of those VPCs lives (to send replies back in VXLAN)."""

    name: str
    revision: int
    vtep_ip: str | None = None
    vpcs: list[GatewayVpc] = Field(default_factory=list)
    static: list[StaticEip] = Field(default_factory=list)
    dnat: list[DnatInfo] = Field(default_factory=list)
    endpoints: list[Endpoint] = Field(default_factory=list)
    eips: list[str] = Field(default_factory=list)  # addresses this instance answers ARP for
    vteps: list[Vtep] = Field(default_factory=list)
