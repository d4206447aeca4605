"""The base of every southbound message, the schema's version, and the overlay's MTU."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, field_validator

OVERLAY_MTU = 1450  # 1500-byte underlay minus 50 bytes of VXLAN/UDP/IP/Ethernet: a VPC's MTU unless it says


class Wire(BaseModel):
    model_config = ConfigDict(frozen=True)

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:
        """pydantic's, the default factories called here. pydantic's asks `inspect.signature` of each factory it
        calls, on every call and uncached (2.14: 540 us for a HostConfigDelta and its eleven lists; a thousand
        streams told of one host joining spent more than half the controller there); this is 4.5 us."""
        given = set(values) if _fields_set is None else _fields_set
        for name, factory in _factories(cls):
            if name not in values:
                values[name] = factory()
        return super().model_construct(given, **values)


@cache
def _factories(cls: type[BaseModel]) -> tuple[tuple[str, Callable[[], Any]], ...]:
    return tuple((n, f.default_factory) for n, f in cls.model_fields.items()
                 if f.default_factory is not None)  # type: ignore[misc]


# The southbound schema's version, "MAJOR.MINOR". A minor version only adds fields, which older agents and gateways
# ignore (a controller of the next minor version serves them); a new major version changes meaning, and an agent
# or gateway that gets one keeps its switch or data plane as it is and reports why (SchemaTooNew).
SCHEMA_VERSION = "1.3"  # 1.3: dual-stack VPCs (IPv6 fields beside the IPv4 ones); 1.2: a gateway section per role


# The oldest southbound schema this agent or gateway takes from a controller. Controllers are upgraded first
# (docs/operations.md, Upgrades): a controller older than this sends configs without fields this release reads as
# "none", and acting on them would remove what the newer fields describe; so nothing of them is applied.
OLDEST_CONTROLLER = "1.3"


class SchemaTooNew(ValueError):
    pass


class ControllerTooOld(ValueError):
    pass


def _minor(v: str) -> tuple[int, int]:
    major, _, minor = v.partition(".")
    return int(major), int(minor or 0)


def check_served(msg: object) -> None:
    """Refuse (ControllerTooOld) a config or delta from a controller older than OLDEST_CONTROLLER: the watch keeps
    what it holds and asks again, and the next answer after the controllers' upgrade is taken."""
    if not isinstance(msg, Versioned):
        return
    v = msg.schema_version if "schema_version" in msg.model_fields_set else "1.0"  # 1.0 did not say
    if _minor(v) < _minor(OLDEST_CONTROLLER):
        raise ControllerTooOld(f"the controller serves southbound schema {v}; this release needs "
                               f"{OLDEST_CONTROLLER} or later: upgrade the controllers first (nothing was applied)")


class Versioned(Wire):
    """The configs and deltas the watches send: they say which schema they are in; a newer major one is refused
    whole (nothing of it is applied)."""

    schema_version: str = SCHEMA_VERSION

    @field_validator("schema_version")
    @classmethod
    def _ours(cls, v: str) -> str:
        # a field validator: one on the whole model ("before") would make pydantic build the config as Python
        # objects first, twice the parse time of a 20,000-port config
        if v.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise SchemaTooNew(f"the controller sends southbound schema {v}; this agent or gateway understands "
                               f"{SCHEMA_VERSION.split('.')[0]}.x: upgrade it (what it runs is kept as it is)")
        return v
