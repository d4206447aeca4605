"""What an emulated cluster is made of, saved as it is made (`<state_dir>/<name>/state.json`), so that `down`
removes exactly that even after a crash, and later commands find the cluster by name; and the topology files
that say what to make (topologies/data/*.json)."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tianji.statusfile import write_atomic

TOPOLOGIES = Path(__file__).parent / "data"
_SAVE_LOCK = threading.Lock()


def load_topology(name_or_path: str) -> dict:
    p = Path(name_or_path)
    if not p.exists():
        p = TOPOLOGIES / f"{name_or_path}.json"
    if not p.exists():
        known = ", ".join(sorted(x.stem for x in TOPOLOGIES.glob("*.json")))
        raise SystemExit(f"unknown topology {name_or_path!r}: use one of {known}, or a path to a JSON file")
    topo = json.loads(p.read_text())
    for key in ("hypervisors",):
        if not topo.get(key):
            raise SystemExit(f"topology {p}: '{key}' must list at least one node")
    if stray := set(topo.get("dpdk_hypervisors", [])) - set(topo["hypervisors"]):
        raise SystemExit(f"topology {p}: 'dpdk_hypervisors' names {', '.join(sorted(stray))}, not among its "
                         "'hypervisors'")
    return topo


@dataclass
class State:
    name: str
    dir: str
    topology: dict = field(default_factory=dict)
    controller_url: str = ""  # every replica's URL as seen from the root namespace, comma-separated
    controller_port: int = 0  # the first replica's
    # one per replica: {"port", "pid", "dir"}; several need PostgreSQL (the topology's "controllers")
    controllers: list[dict] = field(default_factory=list)
    ca: str = ""  # the cluster's CA (PEM): the controller's certificate and every host's are from it
    admin_token: str = ""
    host_tokens: dict[str, str] = field(default_factory=dict)  # one credential per host, bound to it
    orchestrator_token: str = ""  # binds ports to hypervisors, as Nova or a CNI plugin would
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # root-namespace bridges and interfaces
    pids: list[int] = field(default_factory=list)
    hypervisors: dict[str, dict] = field(default_factory=dict)
    vms: dict[str, dict] = field(default_factory=dict)
    nodes: dict[str, dict] = field(default_factory=dict)
    up_seconds: float | None = None
    database_url: str = ""  # empty: SQLite in the controller's state directory
    # which `tianji` each process runs, by its name (controller-0, hv1, gw1): an upgrade moves them one at a time
    # from an earlier release's (topologies/releases.py); absent: this checkout's
    releases: dict[str, str] = field(default_factory=dict)
    hugepages_added: int = 0  # 2 MiB pages added to the kernel's pool for OVS-DPDK hosts, given back at `down`

    @property
    def path(self) -> Path:
        return Path(self.dir) / "state.json"

    def save(self) -> None:
        with _SAVE_LOCK:  # VMs may be plugged from several threads
            write_atomic(self.path, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, state_dir: Path) -> State:
        p = state_dir / "state.json"
        if not p.exists():
            raise SystemExit(f"no cluster state at {p}: bring one up with `tianji cluster up`")
        return cls(**json.loads(p.read_text()))
