"""A config stream whose far end vanishes (its link cut: no FIN, no RST, nothing more acknowledged) is noticed by
TCP on both ends, with no keep-alive line in the meantime: the controller marks the host down one silence after
it stopped acknowledging (controller/southbound/open_streams.py), and the agent's client drops the stream within
about 6 s (tianji/southbound_client.STREAM_SOCKET_OPTIONS) to look for a controller again. Real kernels: the host's
agent client runs in a network namespace behind a veth pair, and the link is cut under it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import served
from tests.support.wait import wait_for
from topologies import netns

ROOT = Path(__file__).resolve().parents[2]
CLIENT = """
import sys, time
from tianji.southbound import HostConfigDelta
from tianji.southbound_client import Southbound
url, token = sys.argv[1], sys.argv[2]
api = Southbound(url, token, timeout=5)
say = lambda *a: print(*a, time.monotonic(), flush=True)
api.stream("/v1/hosts/hv1/config/stream", HostConfigDelta, lambda: {"after": -1}, lambda d, a: say("event"),
           lambda e: say("error"), keepalive=60)
"""


@pytest.fixture
def link() -> Iterator[tuple[str, str, str]]:
    """(namespace, the root side's veth, the root side's address): a /30 between this namespace and a new one."""
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"tjsl{tag}", f"tjsl{tag}a", f"tjsl{tag}b"
    octet = int(tag[:2], 16)
    netns.add(ns)
    try:
        netns.veth(here, None, there, ns)
        netns.address(None, here, f"10.253.{octet}.1/30")
        netns.address(ns, there, f"10.253.{octet}.2/30")
        yield ns, here, f"10.253.{octet}.1"
    finally:
        netns.sh("ip", "link", "del", here, check=False)
        netns.delete([ns])


def lines(p: subprocess.Popen, out: list[str]) -> None:
    def read() -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            out.append(line.strip())
    threading.Thread(target=read, daemon=True).start()


def test_a_vanished_host_is_marked_down_and_its_client_lets_go(link: tuple[str, str, str], tmp_path: Path) -> None:
    ns, here, addr = link
    silence = 4.0
    with served("sqlite", tmp_path, host_down_after=silence, listen="0.0.0.0") as c:
        c.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
        token = c.admin.post("/v1/host-tokens", {"host": "hv1"})["token"]
        out: list[str] = []
        client = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT,
                                   f"http://{addr}:{c.port}", token], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            lines(client, out)
            wait_for(lambda: any(x.startswith("event") for x in out), 20, "the host's first config on its stream")
            assert len(c.app.state.open_streams) == 1
            time.sleep(2 * silence)  # no keep-alive line within a minute: its TCP answers keep it up
            assert c.admin.get("/v1/hosts/hv1")["status"] == "up"
            assert not any(x.startswith("error") for x in out)

            cut = time.monotonic()
            netns.sh("ip", "link", "set", here, "down")  # nothing more crosses; neither end is told
            down = wait_for(lambda: c.admin.get("/v1/hosts/hv1")["status"] == "down", 4 * silence,
                            "the vanished host marked down")
            let_go = wait_for(lambda: any(x.startswith("error") for x in out), 15, "the client to drop its stream")
            err_at = float(next(x for x in out if x.startswith("error")).split()[-1])
            print(f"marked down {down:.1f} s after the cut (silence allowed {silence} s); "
                  f"the client let go {err_at - cut:.1f} s after it")
            assert down < silence + 3  # a silence after its last acknowledgement, and a tick or two
            assert err_at - cut < 9  # TCP_USER_TIMEOUT 6 s, and a keep-alive probe's period
            assert let_go >= 0
        finally:
            client.kill()
            client.wait(5)
