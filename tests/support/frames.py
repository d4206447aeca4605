"""The data-plane interface with no fast path, for the differential tests: every frame goes to Python (the
instance's punt path), injected frames are collected in `out`. It has no C library (`lib` is None), so a role
attached to it runs its Python reference."""

from __future__ import annotations

from pathlib import Path

from nfv_gateways.core.options import GatewayOptions


class PythonFrames:
    backend = "python"
    lib = None

    def __init__(self) -> None:
        self.out: list[tuple[int, bytes]] = []
        self.crossed: dict[str, int] = {}

    def set_vteps(self, *_a: object) -> None:
        pass

    def set_vpc(self, *_a: object) -> None:
        pass

    def remove_vpc(self, *_a: object) -> None:
        pass

    def held(self) -> dict:
        return {}

    def set_neigh(self, *_a: object) -> None:
        pass

    def set_ext_route(self, *_a: object) -> None:
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
