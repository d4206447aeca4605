"""Each gateway fast path on real interfaces (topologies/gwlab.py): a kernel VXLAN "hypervisor", the gateway
instance, an external server. Every path must carry ICMP, UDP and TCP with the server seeing the EIP, keep
established flows in C (native paths), survive hostile frames from both sides, and leave nothing attached when
it stops. In CI every backend must start: DPDK and AF_XDP are installed by `make setup`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from topologies.gwlab import EIP, SERVER_IP, GatewayLab

# a UDP and a TCP echo server that record the source address they see
SERVER = """
import json, socket, socketserver, sys, threading
seen = []
class U(socketserver.BaseRequestHandler):
    def handle(self):
        data, s = self.request
        seen.append(self.client_address[0]); s.sendto(data, self.client_address)
        open(sys.argv[1], "w").write(json.dumps(seen))
class T(socketserver.StreamRequestHandler):
    def handle(self):
        seen.append(self.client_address[0]); self.wfile.write(self.rfile.readline())
        open(sys.argv[1], "w").write(json.dumps(seen))
socketserver.ThreadingTCPServer.allow_reuse_address = True
threading.Thread(target=socketserver.UDPServer(("0.0.0.0", 9000), U).serve_forever, daemon=True).start()
socketserver.ThreadingTCPServer(("0.0.0.0", 9001), T).serve_forever()
"""
CLIENT = """
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2); u.bind(("0.0.0.0", 5555))
ok = 0
for i in range(int(sys.argv[2])):
    u.sendto(b"ping%d" % i, (sys.argv[1], 9000))
    try:
        ok += u.recvfrom(100)[0] == b"ping%d" % i
    except socket.timeout:
        pass
t = socket.create_connection((sys.argv[1], 9001), timeout=3); t.sendall(b"hello\\n")
print(ok, t.makefile().readline().strip())
"""
PATHS = ["dpdk", "xdp", "packet", "python"]


def send_raw(ns: str, dev: str, frames: list[bytes]) -> None:
    """Send frames as they are (the kernel refuses some of the shortest ones: that is fine, the rest go out)."""
    code = ("import socket, sys\ns = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind((sys.argv[1], 0))\n"
            "for h in sys.stdin.read().split():\n"
            "    try:\n        s.send(bytes.fromhex(h))\n    except OSError:\n        pass\n")
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, dev], capture_output=True, text=True,
                       input="\n".join(f.hex() for f in frames))
    assert r.returncode == 0, r.stderr[-500:]


def link_mac(ns: str, dev: str) -> str:
    out = subprocess.run(["ip", "-n", ns, "-j", "link", "show", "dev", dev], capture_output=True, text=True)
    return json.loads(out.stdout)[0]["address"]


@pytest.mark.parametrize("fastpath", PATHS)
def test_fast_path_carries_traffic_and_survives_hostile_frames(fastpath: str, tmp_path) -> None:
    lab = GatewayLab(f"tjt{PATHS.index(fastpath)}")
    try:
        lab.up("tianji", fastpath)
        assert lab.status()["fastpath"].split()[0] == fastpath  # the named path really started, no fallback
        seen = tmp_path / "seen.json"
        srv = subprocess.Popen(["ip", "netns", "exec", lab.server, sys.executable, "-c", SERVER, str(seen)])
        try:
            time.sleep(0.5)
            ping = lab.exec(lab.client, "ping", "-c", "3", "-i", "0.2", "-W", "2", SERVER_IP, check=False)
            assert " 0% packet loss" in ping.stdout, ping.stdout
            out = lab.exec(lab.client, sys.executable, "-c", CLIENT, SERVER_IP, "50").stdout.split()
            assert out == ["50", "hello"]
            assert set(json.loads(seen.read_text())) == {EIP}  # the server only ever sees the EIP

            # hostile frames at the gateway from both sides: the process lives, counters move, traffic goes on
            gw_ul, gw_ext = link_mac(lab.gw, "ul0"), link_mac(lab.gw, "ext0")
            vx = Ether(dst=gw_ul) / IP(src="172.30.0.2", dst="172.30.0.1") / UDP(sport=1, dport=4789)
            hostile_ul = [b"\x00" * 10, bytes(vx / (b"\x08" + b"\0" * 6)),  # truncated VXLAN
                          bytes(vx / (b"\x08\0\0\0\x00\x07\xcf\x00" + bytes(Ether() / IP(dst="1.1.1.1")))),  # VNI 1999!
                          bytes(Ether(dst=gw_ul) / IP(src="172.30.0.99", dst="172.30.0.1") / UDP(dport=4789)
                                / (b"\x08\0\0\0\x00\x03\xe9\x00" + b"\0" * 40)),  # unregistered VTEP
                          bytes(vx / (b"\x08\0\0\0\x00\x03\xe9\x00" + b"\x02" * 12 + b"\x86\xdd" + b"\0" * 40))]
            hostile_ext = [b"\xff" * 5, bytes(Ether(dst=gw_ext) / IP(src=SERVER_IP, dst=EIP, ihl=15) / (b"\0" * 8)),
                           bytes(Ether(dst=gw_ext) / IP(src=SERVER_IP, dst=EIP, chksum=1) / UDP(dport=5555)),
                           bytes(Ether(dst=gw_ext) / IP(src=SERVER_IP, dst=EIP) / UDP(sport=9000, dport=5555,
                                                                                       len=400))]
            before = lab.status()
            send_raw(lab.client, "ul0", hostile_ul * 20)
            send_raw(lab.server, "eth0", hostile_ext * 20)
            time.sleep(1.2)
            after = lab.status()
            assert lab.proc.poll() is None
            def dropped(s: dict) -> int:
                return sum(v for k, v in {**s["counters"], **s["nat"], **s.get("dataplane", {})}.items()
                           if k.startswith("drop"))

            assert dropped(after) > dropped(before)
            out = lab.exec(lab.client, sys.executable, "-c", CLIENT, SERVER_IP, "20").stdout.split()
            assert out == ["20", "hello"]
            if fastpath in ("dpdk", "xdp", "packet"):
                dp = after["dataplane"]
                assert dp["fast_out"] >= 40 and dp["fast_in"] >= 40  # the echo flow stayed in C both ways
            # the operator's view: `tianji gateway status` prints the fast path, counters and table sizes
            cli = subprocess.run([str(Path(sys.executable).with_name("tianji")), "gateway", "status", "lab",
                                  "--state-dir", str(lab.dir)], capture_output=True, text=True)
            assert cli.returncode == 0 and f"fast path {fastpath}" in cli.stdout and "mappings" in cli.stdout
            assert ("dataplane.fast_out" in cli.stdout) == (fastpath in ("dpdk", "xdp", "packet"))
        finally:
            srv.kill()
            srv.wait()
        # a clean stop detaches what it attached: no XDP program, no nftables table left to eat traffic
        os.killpg(lab.proc.pid, 15)
        lab.proc.wait(15)
        links = subprocess.run(["ip", "-n", lab.gw, "link", "show"], capture_output=True, text=True).stdout
        assert "xdp" not in links
        tables = subprocess.run(["ip", "netns", "exec", lab.gw, "nft", "list", "tables"], capture_output=True,
                                text=True).stdout
        assert "tianji_gw" not in tables
    finally:
        lab.down()


def test_auto_picks_the_best_native_path() -> None:
    lab = GatewayLab("tjta")
    try:
        lab.up("tianji", "auto")
        assert lab.status()["fastpath"].split()[0] == "dpdk"
        assert "fast path: dpdk" in lab.log.read_text()
    finally:
        lab.down()


def test_unknown_fastpath_is_refused_clearly(tmp_path) -> None:
    r = subprocess.run([str(sys.executable).replace("python", "tianji"), "gateway", "run", "--name", "x",
                        "--underlay-if", "lo", "--vtep-ip", "127.0.0.1", "--external-if", "lo", "--fastpath",
                        "turbo", "--config-file", str(tmp_path / "none.json")], capture_output=True, text=True)
    assert r.returncode != 0 and "--fastpath turbo" in (r.stdout + r.stderr)

