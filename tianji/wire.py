"""The base of every southbound message, and the overlay's MTU."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

OVERLAY_MTU = 1450  # 1500-byte underlay minus 50 bytes of VXLAN/UDP/IP/Ethernet: a VPC's MTU unless it says


class Wire(BaseModel):
    model_config = ConfigDict(frozen=True)
