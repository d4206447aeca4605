"""The kill-a-replica drill on an emulated cluster with two controller replicas (the scenario and bench/replicas.py
share it): under a 10 ms ping between two hypervisors and through the NAT gateway, while a tenant writes through
the other replica, kill -9 the replica that leads and that every host watches, and measure what the operator sees.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import dataclass, field

from tests.support.wait import wait_for
from tianji.api_client import ApiFailure, Client
from topologies.cluster import Cluster

WRITES_PER_S = 20


def health(cluster: Cluster, i: int) -> dict | None:
    return cluster.replica_health(i)


def ready(cluster: Cluster, i: int) -> dict | None:
    return cluster.replica_health(i, "/readyz")


def hosts(cluster: Cluster) -> list[tuple[str, str]]:
    """(kind, name) of every agent and gateway instance."""
    gws = [n for n, i in cluster.state.nodes.items() if i["role"] == "gateway"]
    return [("agent", h) for h in cluster.state.hypervisors] + [("gateway", g) for g in gws]


def status(cluster: Cluster, kind: str, name: str) -> dict:
    return cluster.agent_status(name) if kind == "agent" else cluster.gateway_status(name)


def whole_configs(cluster: Cluster) -> dict[str, int]:
    """Whole configs each host received so far (a failover must send none)."""
    out = {}
    for kind, name in hosts(cluster):
        st = status(cluster, kind, name)
        out[name] = st.get("whole_configs", 0) if kind == "agent" else st.get("counters", {}).get("whole_configs", 0)
    return out


@dataclass
class Writer:
    """A tenant creating ports through one replica, WRITES_PER_S a second; what was acknowledged is kept."""

    client: Client
    subnet_id: str
    tag: str
    acked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        while not self.stop.wait(1 / WRITES_PER_S):
            i += 1
            try:
                self.acked.append(self.client.post("/v1/ports", {"subnet_id": self.subnet_id,
                                                                 "name": f"{self.tag}-{i}"})["id"])
            except ApiFailure as e:
                self.failed.append(f"{e.status} {e.detail}")

    def __enter__(self) -> Writer:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@dataclass
class Downs:
    """Polls the hosts' states through a replica; any host seen down is kept."""

    client: Client
    seen: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.seen |= {h["name"] for h in self.client.get("/v1/hosts") if h["status"] != "up"}
            except ApiFailure:
                pass

    def __enter__(self) -> Downs:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


class Takeover(threading.Thread):
    """When replica `i` first says it leads, and first that it runs the liveness checks (polled every 50 ms)."""

    def __init__(self, cluster: Cluster, i: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.i, self.seen = cluster, i, {}
        self.client = cluster.replica(i, cluster.state.admin_token, timeout=1.0)
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + 15
        while "liveness" not in self.seen and time.monotonic() < deadline:
            try:
                h = self.client.get("/healthz")
            except ApiFailure:
                h = {}
            t = time.monotonic()
            if h.get("role") == "leader":
                self.seen.setdefault("leader", t)
            if h.get("liveness_checks"):
                self.seen.setdefault("liveness", t)
            time.sleep(0.05)


def pinging(ns: str, ip: str, seconds: float) -> subprocess.Popen:
    """A 10 ms ping for `seconds`."""
    return subprocess.Popen(["ip", "netns", "exec", ns, "ping", "-q", "-i", "0.01", "-W", "1", "-c",
                             str(int(seconds * 100)), ip], stdout=subprocess.PIPE, text=True)


def lost(p: subprocess.Popen) -> tuple[int, int]:
    """(sent, lost) of a finished ping."""
    out, _ = p.communicate(timeout=60)
    m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
    assert m, out
    return int(m.group(1)), int(m.group(1)) - int(m.group(2))


@dataclass
class RoundResult:
    killed: int
    hosts_on_killed: int  # of `hosts`, watching the killed replica when it was killed
    hosts: int
    watch_moved_s: float  # until every agent and gateway said it uses the other replica
    slowest: tuple[str, float]  # the last host to say so, and when
    leader_s: float  # until the other replica led
    liveness_s: float  # until it ran the liveness checks (after its takeover grace)
    port_flows_s: float  # a port created through the survivor during the outage, until its flows on its host
    pings: dict[str, tuple[int, int]]  # (sent, lost) between hypervisors, through the NAT gateway
    writes: int  # acknowledged through the survivor
    writes_lost: int
    writes_failed: list[str]
    hosts_down: set[str]
    whole_configs: dict[str, int]  # received during the round (should be none)
    eips_moved: dict[str, tuple[str | None, str | None]]
    rejoined_as: str | None  # the killed replica's role once back


def kill_round(cluster: Cluster, tenant_token: str, subnet_id: str, hv_port: tuple[str, str], pings: dict,
               tag: str, served) -> RoundResult:
    """One round: kill -9 the leader (which every host watches), measure, bring it back as a follower.
    `pings`: label -> (namespace, address) to ping at 10 ms across the kill; `hv_port`: (subnet id, hypervisor)
    for the port created during the outage; `served()`: EIP -> instance serving it."""
    n = len(cluster.state.controllers)
    lead = cluster.leader()
    assert lead is not None, "no replica leads"
    # after a round every host watches the survivor, which leads: the next round kills the replica they all watch
    # (before the first, hosts restarted meanwhile may have picked the other, the first URL they were given)
    on_killed = sum(v == lead for v in cluster.watching().values())
    other = (lead + 1) % n
    whole0, eips0 = whole_configs(cluster), served()
    survivor = cluster.replica(other, tenant_token)
    orch = cluster.replica(other, cluster.state.orchestrator_token)
    procs = {label: pinging(ns, ip, 4.0) for label, (ns, ip) in pings.items()}
    with Writer(survivor, subnet_id, tag) as writer, Downs(cluster.replica(other,
                                                                          cluster.state.admin_token)) as downs:
        time.sleep(0.5)
        takeover = Takeover(cluster, other)
        t_kill = time.monotonic()
        cluster.kill_controller(lead)
        arrived: dict[str, float] = {}

        def all_moved() -> bool:
            t = time.monotonic() - t_kill
            for host, on in cluster.watching().items():
                if on == other:
                    arrived.setdefault(host, round(t, 3))
            return len(arrived) == len(hosts(cluster))

        moved = wait_for(all_moved, 10, f"every host to watch replica {other}")
        t0 = time.monotonic()
        port = orch.post("/v1/ports", {"subnet_id": hv_port[0], "name": f"{tag}-outage", "host": hv_port[1]})
        vm = cluster.vm_add(port["id"], f"{tag}vm", dhcp=False)  # plugged, and waited for until its flows are in
        port_s = time.monotonic() - t0
        wait_for(lambda: "liveness" in takeover.seen, 10, f"replica {other} to lead and run the liveness checks")
        leader_s, liveness_s = takeover.seen["leader"] - t_kill, takeover.seen["liveness"] - t_kill
        results = {label: lost(p) for label, p in procs.items()}
    ports = {p["id"] for p in survivor.get("/v1/ports")}
    whole1, eips1 = whole_configs(cluster), served()
    cluster.vm_remove(vm["name"])
    cluster.start_controller(lead)
    wait_for(lambda: ready(cluster, lead) is not None, 30, f"replica {lead} to answer again")
    rejoined = (ready(cluster, lead) or {}).get("role")
    for pid in [*writer.acked, port["id"]]:  # what the round made, so that rounds do not pile ports up
        survivor.delete(f"/v1/ports/{pid}")
    return RoundResult(
        killed=lead, hosts_on_killed=on_killed, hosts=len(hosts(cluster)),
        watch_moved_s=round(moved, 3), slowest=max(arrived.items(), key=lambda x: x[1]),
        leader_s=round(leader_s, 3), liveness_s=round(liveness_s, 3),
        port_flows_s=round(port_s, 3), pings=results, writes=len(writer.acked),
        writes_lost=len(set(writer.acked) - ports), writes_failed=writer.failed, hosts_down=downs.seen,
        whole_configs={h: whole1[h] - whole0.get(h, 0) for h in whole1 if whole1[h] != whole0.get(h, 0)},
        eips_moved={e: (eips0.get(e), eips1.get(e)) for e in set(eips0) | set(eips1) if eips0.get(e) != eips1.get(e)},
        rejoined_as=rejoined)
