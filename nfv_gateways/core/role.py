"""What a gateway role is to the instance that runs it: its packet stage and its policy per VPC section.

The instance owns everything roles share (the watch, the sections, neighbours, moving packets); a role owns what
its packets mean. A role is a class in `ROLES`, made with the instance's options and counters, then attached to
the data plane the instance chose (or to none: the Python reference)."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from nfv_gateways.core.packet import Verdict
from tianji.southbound import GatewaySection

if TYPE_CHECKING:
    from nfv_gateways.core.options import GatewayOptions
    from nfv_gateways.core.sections import VpcParts
    from nfv_gateways.native.dataplane import NativeDataPlane

# role -> the class that implements it (imported when run)
ROLES = {"nat": "nfv_gateways.roles.nat.role:NatRole", "lb": "nfv_gateways.roles.lb.role:LbRole",
         "private-line": "nfv_gateways.roles.line.role:LineRole",
         "service": "nfv_gateways.roles.service.role:ServiceRole"}


class PacketStage(Protocol):
    """A role's packet semantics (the Python reference, or its C stage behind the native data plane)."""

    counters: Any

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None: ...
    def inbound(self, buf: bytearray, now: float) -> Verdict | None: ...
    def expire(self, now: float) -> int: ...


class Role(Protocol):
    """A role may also say `owns_external = True`, with `serve_external(instance)` (the handler of the frames the
    data plane punts from the external side, e.g. the private line's tagged handoff), `loops(instance)` (threads of
    its own) and `close()` (what it started, stopped with the instance)."""

    name: ClassVar[str]  # as registered and reported
    expiry_interval: ClassVar[float]  # seconds between the instance's expiry passes

    def __init__(self, o: GatewayOptions, counters: Counter[str]) -> None: ...

    def attach(self, dp: NativeDataPlane | None) -> PacketStage:
        """The role's stage: in C on `dp` (made on `dp.lib`, handed to its loop), or the Python reference when
        `dp` is None or has no C library (`dp.lib` None: a test's frames interface)."""

    def policy_of(self, section: GatewaySection) -> Hashable:
        """The role's part of one VPC's section, in the typed form it installs (compared for equality)."""

    def apply(self, parts: Mapping[str, VpcParts], touched: set[str], first: bool) -> None:
        """Install the policy of the VPCs in `touched` (`parts`: every VPC held after the change; a touched VPC
        missing from it is gone). Called under the instance's lock."""

    def expire(self, now: float) -> None:
        """The role's own timers, every `expiry_interval` seconds (under the lock)."""

    def status(self) -> dict:
        """The role's part of the status file."""


def apply_by_vni(update: Callable[[int, Any], None], vnis: dict[str, int], parts: Mapping[str, VpcParts],
                 touched: set[str]) -> None:
    """For a stage that keys its policy by VNI: each touched VPC's policy handed to `update(vni, policy)`, None for
    a VPC gone or for the VNI it had before (`vnis`: VPC id -> the VNI its policy is installed under, kept here)."""
    for vid in touched:
        new = parts.get(vid)
        old_vni = vnis.pop(vid, None)
        if old_vni is not None and (new is None or new.vni != old_vni):
            update(old_vni, None)
        if new is not None:
            update(new.vni, new.policy)
            vnis[vid] = new.vni


def role_class(role: str) -> type[Role]:
    """The class that runs `role`; SystemExit naming the roles there are for an unknown one."""
    if role not in ROLES:
        raise SystemExit(f"role {role!r} is not available: choose one of {', '.join(sorted(ROLES))}")
    module, cls = ROLES[role].split(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["ROLES", "PacketStage", "Role", "apply_by_vni", "role_class"]
