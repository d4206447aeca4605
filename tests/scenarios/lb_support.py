"""What the load-balancer scenarios share: a tenant's VIP in front of backend VMs that name themselves and the client
address they see, clients that open many connections and count who answered."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from tests.scenarios.conftest import Net, ex, wait_for

# a backend: TCP answers "NAME CLIENT_IP" and closes; UDP echoes "NAME CLIENT_IP:PORT"
BACKEND = """
import socket, sys, threading
name, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", uport))
    while True:
        d, a = u.recvfrom(2048); u.sendto(f"{name} {a[0]}:{a[1]}".encode(), a)
threading.Thread(target=udp, daemon=True).start()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", tport)); s.listen(4096)
def serve(c, a):
    try:
        while True:
            d = c.recv(2048)
            if not d:
                break
            c.sendall(f"{name} {a[0]}\\n".encode())
    except OSError:
        pass
    c.close()
while True:
    c, a = s.accept()
    threading.Thread(target=serve, args=(c, a), daemon=True).start()
"""

# a client: N connections (W at a time) to VIP:PORT, each sends a line and reads who answered; prints one
# "NAME CLIENT_IP" per answered connection and "FAIL n" for the rest
CLIENT = """
import socket, sys
from concurrent.futures import ThreadPoolExecutor
vip, port, n, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def one(i):
    for attempt in range(3):
        try:
            s = socket.create_connection((vip, port), timeout=3)
            s.sendall(b"hi\\n"); got = s.recv(200).decode().strip(); s.close()
            if got:
                return got
        except OSError:
            pass
    return None
fails = 0
with ThreadPoolExecutor(w) as ex:
    for got in ex.map(one, range(n)):
        if got: print(got)
        else: fails += 1
print("FAIL", fails)
"""


@dataclass
class Lb:
    """A tenant's load balancer with one TCP and one UDP listener on a pool, and its backends."""

    net: Net
    lb: dict
    pool: dict
    backends: list[dict]
    members: dict[str, dict] = field(default_factory=dict)  # backend VM name -> member
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def vip(self) -> str:
        return self.lb["vip_address"]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def make_lb(n: Net, vpc: str, subnet: str, backends: list[dict], weights: list[int] | None = None,
            vip: str | None = None, algorithm: str = "maglev", delay: int = 30, tport: int = 80,
            uport: int = 53) -> Lb:
    """VIP:tport (TCP) and VIP:uport (UDP) to each backend's 8080/5353; the backends' group admits them."""
    sg = n.vpcs[vpc]["default_security_group_id"]
    for proto, port in (("tcp", 8080), ("udp", 5353)):
        n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": proto,
                                                          "port_range_min": port, "port_range_max": port,
                                                          "remote_cidr": "0.0.0.0/0"})
    lb = n.client.post("/v1/load-balancers", {"name": "web", "vpc_id": n.vpcs[vpc]["id"],
                                              "subnet_id": n.subnets[subnet]["id"]} | ({"vip_address": vip} if vip
                                                                                      else {}))
    pool = n.client.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "web", "protocol": "tcp",
                                       "algorithm": algorithm, "deregistration_delay_s": delay})
    upool = n.client.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "echo", "protocol": "udp"})
    n.client.post(f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "tcp", "port": tport,
                                                               "default_pool_id": pool["id"]})
    n.client.post(f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "udp", "port": uport,
                                                               "default_pool_id": upool["id"]})
    out = Lb(n, lb, pool, backends)
    for i, b in enumerate(backends):
        w = weights[i] if weights else 1
        out.members[b["name"]] = n.client.post(f"/v1/pools/{pool['id']}/members",
                                               {"port_id": b["port_id"], "protocol_port": 8080, "weight": w})
        n.client.post(f"/v1/pools/{upool['id']}/members", {"port_id": b["port_id"], "protocol_port": 5353})
        out.procs.append(subprocess.Popen(["ip", "netns", "exec", b["ns"], sys.executable, "-c", BACKEND, b["name"],
                                           "8080", "5353"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return out


def connect_many(n: Net, client: dict, vip: str, count: int, port: int = 80, workers: int = 16,
                 timeout: float = 180) -> tuple[Counter, set[str], int]:
    """(answers per backend, client addresses the backends saw, connections that failed)."""
    r = ex(n.cluster, client, sys.executable, "-c", CLIENT, vip, str(port), str(count), str(workers), timeout=timeout)
    assert r.returncode == 0, r.stderr[-500:]
    lines = r.stdout.split("\n")
    answers = [x.split() for x in lines if x and not x.startswith("FAIL")]
    fails = int(next(x for x in lines if x.startswith("FAIL")).split()[1])
    return Counter(a[0] for a in answers), {a[1] for a in answers}, fails


def wait_serving(n: Net, client: dict, vip: str, backends: int, port: int = 80) -> None:
    """Until the VIP answers from every backend (the agents and instances have the config)."""
    def all_answer() -> bool:
        got, _, _ = connect_many(n, client, vip, 30, port, workers=8)
        return len(got) == backends
    wait_for(all_answer, 30, f"the VIP {vip} answering from all {backends} backends", interval=0.5)


def udp_ask(n: Net, client: dict, vip: str, port: int = 53) -> tuple[str, str] | None:
    """(the reply's source address:port, its text) for one datagram to VIP:port."""
    code = ("import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2)\n"
            f"s.sendto(b'x',('{vip}',{port}))\n"
            "try:\n d,a=s.recvfrom(2048);print(f'{a[0]}:{a[1]}',d.decode())\nexcept OSError:\n print('none')")
    r = ex(n.cluster, client, sys.executable, "-c", code)
    out = r.stdout.strip()
    return None if out in ("", "none") else tuple(out.split(" ", 1))  # type: ignore[return-value]


def shares_within(got: Counter, want: dict[str, float], points: float = 0.05) -> bool:
    """Every backend's share of the answers within `points` (absolute) of the share it should have."""
    total = sum(got.values())
    return total > 0 and all(abs(got[k] / total - w) <= points for k, w in want.items())


def settle(seconds: float = 0.5) -> None:
    time.sleep(seconds)
