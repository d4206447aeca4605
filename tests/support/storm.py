"""A storm of concurrent writes of every kind, from several tenants, an orchestrator and the admin, against a real
controller: what the concurrency test asserts (no 5xx, every acknowledged write present afterwards, throughput
within 2x of a single writer's) and what `bench/control_plane.py --storm` prints for both backends.

Each worker loops over one tenant's resources, choosing its next write at random among: VPC create/delete, subnet
create/delete (with ports in it: a 409, not a 500), port create, bulk port create, port delete, security group with
rules, rule create/delete, route create, peering create/delete, EIP allocate/release, load balancer create/delete;
the orchestrator binds and unbinds ports to hosts; the admin rewrites quotas and re-registers hosts."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

HOSTS = [f"storm-hv{i}" for i in range(4)]


@dataclass
class Outcome:
    """What a storm did: answers by status, writes acknowledged, and the objects that should (not) exist."""

    statuses: Counter = field(default_factory=Counter)
    by_op: dict[str, Counter] = field(default_factory=dict)
    acknowledged: int = 0
    seconds: float = 0.0
    server_errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds, every answer
    # path of an object acknowledged created -> (its kind, the path of what its deletion takes it with)
    alive: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)  # paths acknowledged deleted
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rate(self) -> float:
        return self.acknowledged / self.seconds if self.seconds else 0.0

    def latency(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

    def record(self, op: str, r: httpx.Response) -> None:
        with self.lock:
            self.latencies.append(r.elapsed.total_seconds())
            self.statuses[r.status_code] += 1
            self.by_op.setdefault(op, Counter())[r.status_code] += 1
            if r.status_code < 300:
                self.acknowledged += 1
            if r.status_code >= 500:
                self.server_errors.append(f"{op}: {r.status_code} {r.text[:300]}")


class TenantWorker:
    """One thread writing one tenant's resources; several may share a tenant (the contended case)."""

    def __init__(self, url: str, token: str, tenant_id: str, pool_ok: bool, out: Outcome, seed: int,
                 shared: dict[str, Any]) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        self.tenant_id, self.pool_ok, self.out, self.rng = tenant_id, pool_ok, out, random.Random(seed)
        self.s = shared  # this tenant's objects, shared by its workers: vpcs, subnets, ports, sgs, ...
        self.seq = seed * 1000

    def call(self, op: str, method: str, path: str, body: Any = None) -> httpx.Response:
        r = self.http.request(method, path, json=body)
        self.out.record(op, r)
        return r

    def created(self, kind: str, path: str, parent: str | None = None) -> None:
        with self.out.lock:
            self.out.alive[path] = (kind, parent)

    def deleted(self, path: str) -> None:
        with self.out.lock:
            self.out.alive.pop(path, None)
            self.out.gone.add(path)

    def pick(self, kind: str) -> Any:
        with self.s["lock"]:
            items = self.s[kind]
            return self.rng.choice(items) if items else None

    def take(self, kind: str) -> Any:
        with self.s["lock"]:
            items = self.s[kind]
            return items.pop(self.rng.randrange(len(items))) if items else None

    def put(self, kind: str, item: Any) -> None:
        with self.s["lock"]:
            self.s[kind].append(item)

    # --- the writes -------------------------------------------------------------------------------------------
    def vpc_create(self) -> None:
        self.seq += 1
        n = self.seq % 200
        r = self.call("vpc_create", "POST", "/v1/vpcs", {"name": f"v{self.seq}", "cidr": f"10.{n}.0.0/16"})
        if r.status_code == 201:
            v = r.json()
            self.created("vpc", f"/v1/vpcs/{v['id']}")
            self.put("vpcs", {"id": v["id"], "cidr": v["cidr"], "next": 0})

    def vpc_delete(self) -> None:
        v = self.take("vpcs")
        if v is None:
            return
        r = self.call("vpc_delete", "DELETE", f"/v1/vpcs/{v['id']}")
        if r.status_code == 204:
            self.deleted(f"/v1/vpcs/{v['id']}")
        else:
            self.put("vpcs", v)

    def subnet_create(self) -> None:
        v = self.pick("vpcs")
        if v is None:
            return self.vpc_create()
        with self.s["lock"]:
            v["next"] += 1
            k = v["next"]
        base = v["cidr"].split(".")[:2]
        r = self.call("subnet_create", "POST", "/v1/subnets",
                      {"vpc_id": v["id"], "name": f"s{k}", "cidr": f"{base[0]}.{base[1]}.{k % 250}.0/24"})
        if r.status_code == 201:
            sn = r.json()
            self.created("subnet", f"/v1/subnets/{sn['id']}")
            self.put("subnets", sn["id"])

    def subnet_delete(self) -> None:
        sid = self.take("subnets")
        if sid is None:
            return
        r = self.call("subnet_delete", "DELETE", f"/v1/subnets/{sid}")
        if r.status_code == 204:
            self.deleted(f"/v1/subnets/{sid}")
        elif r.status_code != 404:
            self.put("subnets", sid)  # 409: it has ports (created concurrently, perhaps)

    def port_create(self) -> None:
        sid = self.pick("subnets")
        if sid is None:
            return self.subnet_create()
        self.seq += 1
        r = self.call("port_create", "POST", "/v1/ports", {"subnet_id": sid, "name": f"p{self.seq}"})
        if r.status_code == 201:
            self.created("port", f"/v1/ports/{r.json()['id']}")
            self.put("ports", r.json()["id"])

    def port_bulk(self) -> None:
        sid = self.pick("subnets")
        if sid is None:
            return self.subnet_create()
        self.seq += 1
        r = self.call("port_bulk", "POST", "/v1/ports/bulk",
                      {"ports": [{"subnet_id": sid, "name": f"b{self.seq}-{i}"} for i in range(5)]})
        if r.status_code == 201:
            for p in r.json():
                self.created("port", f"/v1/ports/{p['id']}")
                self.put("ports", p["id"])

    def port_delete(self) -> None:
        pid = self.take("ports")
        if pid is None:
            return
        r = self.call("port_delete", "DELETE", f"/v1/ports/{pid}")
        if r.status_code == 204:
            self.deleted(f"/v1/ports/{pid}")
        elif r.status_code != 404:
            self.put("ports", pid)

    def sg_create(self) -> None:
        v = self.pick("vpcs")
        if v is None:
            return self.vpc_create()
        self.seq += 1
        r = self.call("sg_create", "POST", "/v1/security-groups", {
            "vpc_id": v["id"], "name": f"g{self.seq}",
            "rules": [{"direction": "ingress", "protocol": "tcp", "port_range_min": 22, "port_range_max": 22}]})
        if r.status_code == 201:
            self.created("security group", f"/v1/security-groups/{r.json()['id']}", f"/v1/vpcs/{v['id']}")
            self.put("sgs", r.json()["id"])

    def rule_create(self) -> None:
        g = self.pick("sgs")
        if g is None:
            return self.sg_create()
        self.seq += 1
        r = self.call("rule_create", "POST", f"/v1/security-groups/{g}/rules",
                      {"direction": "ingress", "protocol": "udp", "port_range_min": 1 + self.seq % 60000,
                       "port_range_max": 1 + self.seq % 60000})
        if r.status_code == 201:
            self.put("rules", (g, r.json()["id"]))

    def rule_delete(self) -> None:
        x = self.take("rules")
        if x is not None:
            self.call("rule_delete", "DELETE", f"/v1/security-groups/{x[0]}/rules/{x[1]}")

    def sg_delete(self) -> None:
        g = self.take("sgs")
        if g is None:
            return
        r = self.call("sg_delete", "DELETE", f"/v1/security-groups/{g}")
        if r.status_code == 204:
            self.deleted(f"/v1/security-groups/{g}")
        elif r.status_code != 404:
            self.put("sgs", g)

    def peering(self) -> None:
        a, b = self.pick("vpcs"), self.pick("vpcs")
        if a is None or b is None or a["id"] == b["id"]:
            return self.vpc_create()
        r = self.call("peering_create", "POST", "/v1/peerings",
                      {"requester_vpc_id": a["id"], "accepter_vpc_id": b["id"]})
        if r.status_code == 201:
            pid = r.json()["id"]
            self.created("peering", f"/v1/peerings/{pid}")
            r = self.call("route_create", "POST", f"/v1/vpcs/{a['id']}/routes",
                          {"destination": b["cidr"], "target": f"peering:{pid}"})
            r = self.call("peering_delete", "DELETE", f"/v1/peerings/{pid}")
            if r.status_code == 204:
                self.deleted(f"/v1/peerings/{pid}")

    def eip(self) -> None:
        if not self.pool_ok:
            return
        r = self.call("eip_create", "POST", "/v1/eips", {})
        if r.status_code == 201:
            eid = r.json()["id"]
            if self.rng.random() < 0.5:
                r = self.call("eip_delete", "DELETE", f"/v1/eips/{eid}")
                if r.status_code == 204:
                    return
            self.created("EIP", f"/v1/eips/{eid}")

    def lb(self) -> None:
        sid = self.pick("subnets")
        v = None
        if sid is None:
            return self.subnet_create()
        r = self.http.get(f"/v1/subnets/{sid}")
        if r.status_code != 200:
            return
        v = r.json()["vpc_id"]
        self.seq += 1
        r = self.call("lb_create", "POST", "/v1/load-balancers", {"name": f"lb{self.seq}", "vpc_id": v,
                                                                  "subnet_id": sid})
        if r.status_code == 201:
            lid = r.json()["id"]
            if self.rng.random() < 0.5:
                r = self.call("lb_delete", "DELETE", f"/v1/load-balancers/{lid}")
                if r.status_code == 204:
                    return
            self.created("load balancer", f"/v1/load-balancers/{lid}")

    OPS = {"vpc_create": 2, "vpc_delete": 1, "subnet_create": 4, "subnet_delete": 2, "port_create": 10,
           "port_bulk": 3, "port_delete": 3, "sg_create": 2, "sg_delete": 1, "rule_create": 2, "rule_delete": 1,
           "peering": 1, "eip": 1, "lb": 1}

    def run(self, until: float) -> None:
        names, weights = list(self.OPS), list(self.OPS.values())
        while time.monotonic() < until:
            op = self.rng.choices(names, weights)[0]
            getattr(self, op if op != "peering" else "peering")()


class Orchestrator:
    """Binds tenants' ports to hosts and unbinds them, as a VM scheduler does."""

    def __init__(self, url: str, token: str, shared: list[dict[str, Any]], out: Outcome, seed: int) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        self.shared, self.out, self.rng = shared, out, random.Random(seed)

    def run(self, until: float) -> None:
        while time.monotonic() < until:
            s = self.rng.choice(self.shared)
            with s["lock"]:
                pid = self.rng.choice(s["ports"]) if s["ports"] else None
            if pid is None:
                time.sleep(0.01)
                continue
            host = self.rng.choice([*HOSTS, None])
            r = self.http.patch(f"/v1/ports/{pid}", json={"host": host})
            self.out.record("port_bind", r)


class Admin:
    """Rewrites quotas and re-registers hosts while the tenants write."""

    def __init__(self, url: str, token: str, tenants: list[str], out: Outcome, seed: int) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        self.tenants, self.out, self.rng = tenants, out, random.Random(seed)

    def run(self, until: float) -> None:
        i = 0
        while time.monotonic() < until:
            i += 1
            if i % 2:
                t = self.rng.choice(self.tenants)
                r = self.http.put(f"/v1/tenants/{t}/quotas", json={"ports": 100_000 + i, "subnets": 10_000})
                self.out.record("quota_update", r)
            else:
                h = self.rng.choice(HOSTS)
                r = self.http.post("/v1/hosts", json={"name": h, "vtep_ip": f"192.0.2.{HOSTS.index(h) + 10}"})
                self.out.record("host_register", r)
            time.sleep(0.02)


def prepare(url: str, admin_token: str, n_tenants: int) -> tuple[list[tuple[str, str]], str, bool]:
    """Tenants (id, token) with generous quotas, an orchestrator token, hosts and an EIP pool."""
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60)
    tenants = []
    for i in range(n_tenants):
        t = admin.post("/v1/tenants", json={"name": f"storm-{i}-{random.randrange(1 << 30)}"}).json()
        admin.put(f"/v1/tenants/{t['id']}/quotas", json={"ports": 100_000, "subnets": 10_000, "vpcs": 1000,
                                                         "security_groups": 10_000,
                                                         "security_group_rules": 100_000, "eips": 1000,
                                                         "load_balancers": 1000, "peerings": 1000})
        tenants.append((t["id"], t["token"]))
    for i, h in enumerate(HOSTS):
        admin.post("/v1/hosts", json={"name": h, "vtep_ip": f"192.0.2.{i + 10}"})
    orch = admin.post("/v1/orchestrator-tokens", json={"name": f"storm-o-{random.randrange(1 << 30)}"}).json()
    pool = admin.post("/v1/eip-pools", json={"cidr": "198.18.0.0/16"})
    return tenants, orch["token"], pool.status_code in (201, 409)


def storm(url: str, admin_token: str, seconds: float, tenants: int = 3, workers_per_tenant: int = 3,
          orchestrator: bool = True, admin: bool = True, seed: int = 1) -> Outcome:
    """Run the mix for `seconds`: `workers_per_tenant` threads for each of `tenants` tenants, plus the orchestrator
    and the admin. tenants=1, workers_per_tenant=1 and neither of the others is the single writer."""
    made, orch_token, pool_ok = prepare(url, admin_token, tenants)
    out = Outcome()
    shared = [{"lock": threading.Lock(), "vpcs": [], "subnets": [], "ports": [], "sgs": [], "rules": []}
              for _ in made]
    runners: list[Any] = []
    for ti, (tid, token) in enumerate(made):
        for w in range(workers_per_tenant):
            runners.append(TenantWorker(url, token, tid, pool_ok, out, seed * 100 + ti * 10 + w, shared[ti]))
    if orchestrator:
        runners.append(Orchestrator(url, orch_token, shared, out, seed))
    if admin:
        runners.append(Admin(url, admin_token, [t for t, _ in made], out, seed))
    start = time.monotonic()
    until = start + seconds
    threads = [threading.Thread(target=r.run, args=(until,), daemon=True) for r in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 180)
    out.seconds = time.monotonic() - start
    return out


def verify(url: str, admin_token: str, out: Outcome) -> list[str]:
    """Every object acknowledged created and not acknowledged deleted exists; every one acknowledged deleted does
    not. What is wrong, one line per object."""
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60)
    wrong = []
    for path, (kind, parent) in sorted(out.alive.items()):
        if parent in out.gone:
            continue  # a VPC's delete takes its security groups
        r = admin.get(path)
        if r.status_code != 200:
            wrong.append(f"{kind} {path}: acknowledged created, now {r.status_code}")
    for path in sorted(out.gone):
        r = admin.get(path)
        if r.status_code != 404:
            wrong.append(f"{path}: acknowledged deleted, now {r.status_code}")
    return wrong
