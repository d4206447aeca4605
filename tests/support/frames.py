"""The data-plane interface with no fast path, for the differential tests: every frame goes to Python (the
instance's punt path), injected frames are collected in `out`. `tables`: the stage the role takes from a data plane
(`nat`, `lb`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nfv_gateways.framework import GatewayOptions


class PythonFrames:
    backend = "python"

    def __init__(self, **tables: Any) -> None:
        self.out: list[tuple[int, bytes]] = []
        for name, table in tables.items():
            setattr(self, name, table)

    def set_config(self, *_a: object) -> None:
        pass

    def set_lb(self, *_a: object) -> None:
        pass

    def set_neigh(self, *_a: object) -> None:
        pass

    def inject(self, port: int, frame: bytes) -> bool:
        self.out.append((port, frame))
        return True

    def stats(self) -> dict:
        return {}


def lab_options(tmp: Path, vtep: str, macs: tuple[str, str]) -> GatewayOptions:
    """A gateway instance's options for a test: no controller, the given VTEP and (underlay, external) MACs."""
    return GatewayOptions(name="t", controller="", token="", underlay_if="ul0", vtep_ip=f"{vtep}/24",
                          external_if="ext0", state_dir=tmp, macs=macs)
