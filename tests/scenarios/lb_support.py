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
            if d[:4] in (b"GET ", b"HEAD"):  # a health check
                c.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n"); break
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
    upool: dict = field(default_factory=dict)

    @property
    def vip(self) -> str:
        return self.lb["vip_address"]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def make_lb(n: Net, vpc: str, subnet: str, backends: list[dict], weights: list[int] | None = None,
            vip: str | None = None, algorithm: str = "maglev", delay: int = 30, tport: int = 80,
            uport: int = 53, eip_id: str | None = None, udp_idle: int = 350) -> Lb:
    """VIP:tport (TCP) and VIP:uport (UDP) to each backend's 8080/5353; the backends' group admits them."""
    sg = n.vpcs[vpc]["default_security_group_id"]
    for proto, port in (("tcp", 8080), ("udp", 5353)):
        n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": proto,
                                                          "port_range_min": port, "port_range_max": port,
                                                          "remote_cidr": "0.0.0.0/0"})
    lb = n.client.post("/v1/load-balancers", {"name": "web", "vpc_id": n.vpcs[vpc]["id"],
                                              "subnet_id": n.subnets[subnet]["id"]}
                        | ({"vip_address": vip} if vip else {}) | ({"eip_id": eip_id} if eip_id else {}))
    pool = n.client.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "web", "protocol": "tcp",
                                       "algorithm": algorithm, "deregistration_delay_s": delay})
    upool = n.client.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "echo", "protocol": "udp"})
    n.client.post(f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "tcp", "port": tport,
                                                               "default_pool_id": pool["id"]})
    n.client.post(f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "udp", "port": uport,
                                                               "default_pool_id": upool["id"],
                                                               "idle_timeout_s": udp_idle})
    out = Lb(n, lb, pool, backends)
    for i, b in enumerate(backends):
        w = weights[i] if weights else 1
        out.members[b["name"]] = n.client.post(f"/v1/pools/{pool['id']}/members",
                                               {"port_id": b["port_id"], "protocol_port": 8080, "weight": w})
        n.client.post(f"/v1/pools/{upool['id']}/members", {"port_id": b["port_id"], "protocol_port": 5353})
        out.procs.append(start_backend(b))
    out.upool = upool
    return out


def start_backend(b: dict) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", b["ns"], sys.executable, "-c", BACKEND, b["name"], "8080", "5353"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# UDP flows with fixed source ports: "SPORT BACKEND" per answered flow
UDP_FLOWS = """
import socket, sys
vip, port, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for sp in range(lo, hi):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", sp)); s.settimeout(1)
    for attempt in range(3):
        try:
            s.sendto(b"x", (vip, port)); print(sp, s.recv(200).decode().split()[0]); break
        except OSError:
            pass
    s.close()
"""


def udp_flows(n: Net, client: dict, vip: str, sports: range, port: int = 53) -> dict[int, str]:
    """Source port -> the backend that answered, for one UDP flow per source port."""
    r = ex(n.cluster, client, sys.executable, "-c", UDP_FLOWS, vip, str(port), str(sports.start), str(sports.stop),
           timeout=120)
    return {int(a): b for a, b in (line.split() for line in r.stdout.splitlines())}


def connect_many(n: Net, client: dict, vip: str, count: int, port: int = 80, workers: int = 16,
                 timeout: float = 180, ns: str | None = None) -> tuple[Counter, dict[str, set[str]], int]:
    """(answers per backend, the client addresses each backend saw, connections that failed); `ns`: run in this
    namespace instead of the client VM's (the internet host)."""
    cmd = [sys.executable, "-c", CLIENT, vip, str(port), str(count), str(workers)]
    r = subprocess.run(["ip", "netns", "exec", ns or client["ns"], *cmd], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-500:]
    lines = r.stdout.split("\n")
    answers = [x.split() for x in lines if x and not x.startswith("FAIL")]
    fails = int(next(x for x in lines if x.startswith("FAIL")).split()[1])
    seen: dict[str, set[str]] = {}
    for backend, addr in answers:
        seen.setdefault(backend, set()).add(addr)
    return Counter(a[0] for a in answers), seen, fails


def wait_serving(n: Net, client: dict, vip: str, backends: int, port: int = 80) -> None:
    """Until the VIP answers from every backend (the agents and instances have the config)."""
    def all_answer() -> bool:
        got, _, _ = connect_many(n, client, vip, 30, port, workers=8)
        return len(got) == backends
    wait_for(all_answer, 30, f"the VIP {vip} answering from all {backends} backends", interval=0.5)


# long-lived connections: K of them to VIP:PORT, each sends a line every 0.2 s for S seconds; prints per line
# "CONN_INDEX SECONDS BACKEND" or "CONN_INDEX SECONDS ERR" (then that connection stops)
HOLD = """
import socket, sys, threading, time
vip, port, k, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
t0 = time.monotonic(); lock = threading.Lock()
def say(*a):
    with lock: print(*a, flush=True)
def one(i):
    try:
        s = socket.create_connection((vip, port), timeout=3)
    except OSError:
        say(i, 0, "ERR"); return
    while time.monotonic() - t0 < secs:
        try:
            s.sendall(b"x\\n"); got = s.recv(200).decode().split()
            if not got: raise OSError("closed")
            say(i, round(time.monotonic() - t0, 2), got[0])
        except OSError:
            say(i, round(time.monotonic() - t0, 2), "ERR"); return
        time.sleep(0.2)
ts = [threading.Thread(target=one, args=(i,)) for i in range(k)]
[t.start() for t in ts]; [t.join() for t in ts]
"""


def hold(client: dict, vip: str, k: int, seconds: float, port: int = 80) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", client["ns"], sys.executable, "-c", HOLD, vip, str(port), str(k),
                             str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def held(p: subprocess.Popen, timeout: float = 120) -> dict[int, list[tuple[float, str]]]:
    """Per long-lived connection, its (time, backend or ERR) answers."""
    out, _ = p.communicate(timeout=timeout)
    conns: dict[int, list[tuple[float, str]]] = {}
    for line in out.splitlines():
        i, t, who = line.split()
        conns.setdefault(int(i), []).append((float(t), who))
    return conns


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
