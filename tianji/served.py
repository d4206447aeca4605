"""What a gateway instance serves besides NAT, on the wire: the load balancers and private lines of a VPC's
section (`southbound.GatewaySection`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tianji.wire import OVERLAY_MTU, Wire


class LbMemberServed(Wire):
    """A member as an LB instance picks it: `id` keys its Maglev permutation (stable across instances); weight 0
    drains it (no new connections) until `drain_until` (epoch seconds), when its connections end."""

    id: str
    ip: str
    weight: int
    drain_until: float | None = None


class LbListenerServed(Wire):
    protocol: Literal["tcp", "udp"]
    port: int
    idle_timeout_s: float
    algorithm: Literal["maglev", "source_ip"] = "maglev"
    table_size: int = 65537
    members: list[LbMemberServed] = Field(default_factory=list)  # those the pool sends to (health applied)


class LbServed(Wire):
    """A load balancer an LB instance serves: its VIP in its VPC's VNI, its EIP (if this instance homes it), and
    per listener the pool's members."""

    id: str
    vni: int
    vip: str
    eip: str | None = None
    listeners: list[LbListenerServed] = Field(default_factory=list)


class LineSessionServed(Wire):
    """A BGP session of a private line placed on this instance: the cloud's address on the VLAN, the customer's."""

    local_ip: str
    customer_ip: str
    prefixlen: int  # of the pair: 30 or 31


class PrivateLineServed(Wire):
    """A private line a private-line instance carries: VLAN `vlan_id` on the handoff is VNI `vni` inside, the BGP
    sessions placed here (possibly none: the line's traffic from the VPC still may come here), the VPC's CIDR
    (advertised), and the customer's prefixes reached without BGP."""

    id: str
    vni: int
    vlan_id: int
    local_asn: int
    customer_asn: int
    md5_password: str | None = None
    max_prefixes: int = 100
    vpc_cidr: str
    mtu: int = OVERLAY_MTU  # the VPC's: what comes in bigger is fragmented or refused (DF) at the gateway
    sessions: list[LineSessionServed] = Field(default_factory=list)
    static_routes: list[str] = Field(default_factory=list)


class ServiceRuleServed(Wire):
    """An ingress rule of an endpoint's security groups: what VMs may open to it (remote groups as addresses)."""

    protocol: Literal["tcp", "udp", "icmp", "any"]
    port_min: int | None = None
    port_max: int | None = None
    cidrs: list[str] = Field(default_factory=list)


class ServicePortServed(Wire):
    protocol: Literal["tcp", "udp"]
    port: int


class ServicePeerServed(Wire):
    """A VPC peered with the endpoint's: its VMs reach the endpoint (their vSwitches tunnel with the endpoint VPC's
    VNI, as distributed peering does), and the replies go back in `vni`."""

    cidr: str
    vni: int


class ServiceEndpointServed(Wire):
    """An endpoint a service instance serves: what a VM of VNI `vni` sends to `ip` (the endpoint's address in its
    subnet) on one of `ports` leaves for one of the service's `addresses` from `source` (the endpoint's own address
    on the service network, which tells the service who it is; a published load balancer's: `via_vni`, and no
    `ports`, its listeners decide); `proxy_protocol`: TCP streams begin with a PROXY v2
    header naming the VM and the endpoint (`id`). `rules`: the endpoint's ingress security-group rules."""

    id: str
    vni: int
    ip: str
    mac: str
    source: str
    addresses: list[str]
    ports: list[ServicePortServed] = Field(default_factory=list)
    proxy_protocol: bool = False
    rules: list[ServiceRuleServed] = Field(default_factory=list)
    mtu: int = OVERLAY_MTU
    via_vni: int = 0  # a published load balancer's: its VIP (`addresses`) is in this VNI, `source` a port there
    peers: list[ServicePeerServed] = Field(default_factory=list)
