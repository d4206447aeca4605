"""Long-lived traffic for the upgrade: pings every 10 ms, a TCP probe that opens a connection every 100 ms, and one
long TCP stream. Each reports its losses as gaps (runs of consecutive losses): one gateway failover is one gap."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass
class Loss:
    sent: int
    lost: int
    gaps: list[int]  # each run of consecutive losses, in probes
    interval_s: float
    at: list[float]  # when each gap began (time.time())

    @property
    def longest_s(self) -> float:
        return max(self.gaps, default=0) * self.interval_s

    def __str__(self) -> str:
        return (f"{self.lost} of {self.sent} lost in {len(self.gaps)} gap(s), the longest "
                f"{self.longest_s * 1000:.0f} ms")


def gaps_of(outcomes: list[bool]) -> list[int]:
    runs, cur = [], 0
    for ok in outcomes:
        if ok:
            if cur:
                runs.append(cur)
            cur = 0
        else:
            cur += 1
    return runs  # a run still open at the end is the stop's, not a loss


def gap_times(outcomes: list[bool], times: list[float]) -> list[float]:
    return [times[i] for i, ok in enumerate(outcomes) if not ok and (i == 0 or outcomes[i - 1]) and
            any(outcomes[i:])]


class Pinger:
    def __init__(self, ns: str, ip: str, interval: float = 0.01) -> None:
        self.interval = interval
        self.out = tempfile.TemporaryFile("w+")  # a pipe nobody reads until the end would stop ping once full
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, "ping", "-n", "-D", "-O", "-i", str(interval), "-W",
                                   "1", ip], stdout=self.out, text=True)

    def stop(self) -> Loss:
        self.p.send_signal(signal.SIGINT)
        self.p.wait(30)
        self.out.seek(0)
        text = self.out.read()
        got = {int(s): float(t) for t, s in re.findall(r"\[([\d.]+)\] \d+ bytes from .*icmp_seq=(\d+) ", text)}
        # -O: "no answer yet for icmp_seq=N", stamped, when the next is sent without an answer to N
        late = {int(s): float(t) for t, s in re.findall(r"\[([\d.]+)\] no answer yet for icmp_seq=(\d+)", text)}
        last = max(got, default=0)
        outcomes = [s in got for s in range(1, last + 1)]
        t0 = min(got.values(), default=0.0)
        times = [got.get(s) or late.get(s) or t0 + (s - 1) * self.interval for s in range(1, last + 1)]
        return Loss(len(outcomes), outcomes.count(False), gaps_of(outcomes), self.interval, gap_times(outcomes, times))


# every INTERVAL a new TCP connection to HOST:PORT that must answer (a line, or an HTTP status) within 1 s: "1" or "0"
PROBE = r"""
import socket, sys, time
host, port, interval, http = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "http"
while True:
    t = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.settimeout(1)
            s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n" if http else b"x\n")
            ok = bool(s.recv(64))
    except OSError:
        ok = False
    print(f"{time.time():.3f}", 1 if ok else 0, flush=True)
    time.sleep(max(0.0, interval - (time.monotonic() - t)))
"""


class Probe:
    def __init__(self, ns: str, host: str, port: int, interval: float = 0.1, http: bool = False) -> None:
        self.interval = interval
        self.out = tempfile.TemporaryFile("w+")
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE, host, str(port),
                                   str(interval), "http" if http else "line"], stdout=self.out, text=True)

    def stop(self) -> Loss:
        self.p.terminate()
        self.p.wait(30)
        self.out.seek(0)
        out = self.out.read()
        rows = [line.split() for line in out.splitlines() if len(line.split()) == 2]
        outcomes, times = [ok == "1" for _, ok in rows], [float(t) for t, _ in rows]
        return Loss(len(outcomes), outcomes.count(False), gaps_of(outcomes), self.interval, gap_times(outcomes, times))


# one TCP connection, written to every 10 ms until SIGTERM, then half-closed: the server answers the bytes it got
STREAM_SERVER = r"""
import socket, sys
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
c, _ = srv.accept()
n = 0
while chunk := c.recv(65536):
    n += len(chunk)
c.sendall(str(n).encode())
"""
STREAM_CLIENT = r"""
import signal, socket, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
sent = 0
try:
    while not stop:
        s.sendall(b"u" * 2048); sent += 2048
        time.sleep(0.01)
    s.shutdown(socket.SHUT_WR)
    print("survived", sent, s.recv(100).decode(), flush=True)
except OSError as e:
    print("broke", sent, e, flush=True)
"""


class Stream:
    def __init__(self, client_ns: str, server_ns: str, server_ip: str, port: int = 5302) -> None:
        import time

        self.server = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", STREAM_SERVER,
                                        str(port)])
        time.sleep(0.5)
        self.client = subprocess.Popen(["ip", "netns", "exec", client_ns, sys.executable, "-c", STREAM_CLIENT,
                                        server_ip, str(port)], stdout=subprocess.PIPE, text=True)

    def stop(self) -> tuple[bool, str]:
        """(whether the one connection carried every byte to the end, what the client said)."""
        self.client.terminate()
        out, _ = self.client.communicate(timeout=30)
        self.server.wait(10)
        words = out.split()
        return len(words) == 3 and words[0] == "survived" and words[1] == words[2], out.strip()
