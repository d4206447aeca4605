"""What the differential tests pit against each other: the data-plane interface with no fast path (every frame goes
to Python, the instance's punt path, injected frames collected in `out`; no C library, so a role attached to it
runs its Python reference), and `InstancePair`, one instance on the native loop beside one on that."""

from __future__ import annotations

from pathlib import Path

from nfv_gateways.core.instance import Instance
from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.packet import ip2int
from nfv_gateways.native.dataplane import NativeDataPlane


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


class InstancePair:
    """Two instances of `role` with options `o`: one on the native data plane's memory backend (C decides, the rest
    is punted to its Python), one on PythonFrames; `step` hands both a frame and returns what each sent."""

    def __init__(self, o: GatewayOptions, role: str) -> None:
        assert o.macs is not None
        ul, ext = (bytes.fromhex(m.replace(":", "")) for m in o.macs)
        self.dp = NativeDataPlane("mem", "t", o.underlay_if, o.external_if, ul, ext, ip2int(o.vtep_ip.split("/")[0]))
        self.native = Instance(o, role, dataplane=self.dp)
        self.ref_dp = PythonFrames()
        self.ref = Instance(o, role, dataplane=self.ref_dp)

    def drain_native(self) -> list[tuple[int, bytes]]:
        self.dp.poll()
        return self.dp.mem_pop()

    def drain_ref(self) -> list[tuple[int, bytes]]:
        out, self.ref_dp.out = self.ref_dp.out, []
        return out

    def step(self, port: int, frame: bytes) -> tuple[list, list]:
        self.dp.mem_push(port, frame)
        self.dp.poll()
        for p, f in self.dp.punt(0):
            self.native.packets.handle_punt(p, f)
        native = self.drain_native()
        self.ref.packets.handle_punt(port, frame)
        return native, self.drain_ref()

    def close(self) -> None:
        self.dp.close()

