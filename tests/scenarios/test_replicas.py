"""Controller replicas: two controllers on PostgreSQL, every agent and gateway given both URLs (the session's
cluster runs so whenever PostgreSQL is there, as in CI). Each round kills -9 the replica that leads and that every
host watches, under a 10 ms ping between two hypervisors and through the NAT gateway, while a tenant writes
through the other; then brings it back, and the next round kills the other (tests/support/replicas.py)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509
from scapy.all import TCP

from tests.scenarios.conftest import Capture, reach, wait_for
from tests.scenarios.nat_support import nat_vpc, nat_works, served
from tests.support.replicas import kill_round
from tianji.pki import Authority
from topologies.control_plane import CONTROLLER_MGMT_IP

ROUNDS = int(os.environ.get("TIANJI_REPLICA_ROUNDS", "10"))


def test_replicas_0_the_management_network_carries_no_secret_in_clear(cluster) -> None:
    """Three seconds of the management network (every agent's and gateway's beats and watches, each request with
    its bearer token) hold TLS records and not one token; from a hypervisor, a certificate from another CA is
    refused, and hv1's certificate reads no other host's config, even with that host's token."""
    st = cluster.state
    cap = Capture(None, f"{st.name}-mg", "tcp")
    time.sleep(3)
    pkts = cap.stop()
    raw = b"".join(bytes(p) for p in pkts)
    ports = {c["port"] for c in st.controllers}
    to_controllers = [bytes(p[TCP].payload) for p in pkts if TCP in p and p[TCP].dport in ports
                      and bytes(p[TCP].payload)]
    assert len(to_controllers) > 20, "no requests seen on the management network"
    assert sum(x[:3] == b"\x17\x03\x03" for x in to_controllers) > 20  # TLS application data records
    assert b"Bearer" not in raw and b"HTTP/1.1" not in raw
    secrets = {"admin": st.admin_token, "orchestrator": st.orchestrator_token, **st.host_tokens}
    assert not [who for who, tok in secrets.items() if tok.encode() in raw]

    hv1 = cluster.hypervisor("hv1")
    url = cluster.urls_from(CONTROLLER_MGMT_IP).split(",")[0]
    pki = Path(st.dir) / "pki"
    other = Authority(Path(st.dir) / "other-ca")
    other.issue("hv1")

    def curl(cert_dir: Path, token: str, path: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", hv1.ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                               "--cacert", st.ca, "--cert", str(cert_dir / "hv1.pem"), "--key",
                               str(cert_dir / "hv1.key"), "-H", f"Authorization: Bearer {token}", f"{url}{path}"],
                              capture_output=True, text=True, timeout=30)

    assert curl(pki, st.host_tokens["hv1"], "/v1/hosts/hv1/config").stdout == "200"
    refused = curl(other.dir, st.host_tokens["hv1"], "/v1/hosts/hv1/config")
    assert refused.returncode != 0 and refused.stdout in ("", "000")  # the handshake fails: no HTTP at all
    for token in (st.host_tokens["hv1"], st.host_tokens["hv2"]):
        assert curl(pki, token, "/v1/hosts/hv2/config").stdout == "403"


def test_replicas_1_kill_the_leader_ten_times(cluster, tenants, internet) -> None:
    if len(cluster.state.controllers) < 2:
        pytest.fail("this scenario needs two controller replicas, which need PostgreSQL: run with TIANJI_TEST_PG=1 "
                    "and PostgreSQL at 127.0.0.1:5432 (scripts/run-tests.sh does when it answers)")
    n, eip, _gw = nat_vpc(tenants, subnet="10.0.1.0/24")
    writes = n.client.post("/v1/subnets", {"vpc_id": n.vpcs["prod"]["id"], "name": "w", "cidr": "10.0.64.0/18"})
    a, b = n.vm("s", "hv1"), n.vm("s", "hv2")
    nat_works(cluster, a, internet, eip["address"])
    assert reach(cluster, a, b["ip"])
    token = n.client.token
    pings = {"hv1->hv2": (a["ns"], b["ip"]), "hv1->NAT->internet": (a["ns"], internet["ip"])}
    for r in range(ROUNDS):
        got = kill_round(cluster, token, writes["id"], (n.subnets["s"]["id"], "hv3"), pings, f"r{r}",
                         lambda: served(cluster))
        where = f"round {r + 1} (killed replica {got.killed}): {got}"
        print(where)
        assert got.hosts_on_killed == got.hosts or r == 0, where  # the replica every host watches
        assert got.watch_moved_s < 3.0, where
        assert got.liveness_s < 5.0, where
        assert all(lost == 0 for _sent, lost in got.pings.values()), where
        assert got.writes > 0 and got.writes_lost == 0 and not got.writes_failed, where
        assert not got.hosts_down and not got.eips_moved, where
        assert not got.whole_configs, where  # every host resumed its watch from its revision
        assert got.rejoined_as == "follower", where
        nat_works(cluster, a, internet, eip["address"])


def test_replicas_2_certificate_rotation_by_sighup_keeps_every_watch(cluster, tenants) -> None:
    """A new controller certificate over the old files, SIGHUP to every replica: new connections get it, no agent
    or gateway moved or was sent a whole config, and a write still reaches the hypervisors."""
    st = cluster.state
    before = {i: served_serial(cluster, i) for i in range(len(st.controllers))}
    moves = {n: (cluster.agent_status(n) if n in st.hypervisors else cluster.gateway_status(n))
             .get("controller_failovers") for n in cluster.watching()}
    whole = {h: cluster.agent_status(h)["whole_configs"] for h in st.hypervisors}
    Authority(Path(st.dir) / "pki").issue("controller", server_names=["127.0.0.1", "localhost", CONTROLLER_MGMT_IP])
    for c in st.controllers:
        os.killpg(c["pid"], signal.SIGHUP)
    wait_for(lambda: all(served_serial(cluster, i) != before[i] for i in before), 10, "the new certificate")
    n = tenants()
    n.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    vm = n.vm("s", "hv2")  # plugged, and waited for until its flows are in
    assert vm["ip"]
    assert {n: (cluster.agent_status(n) if n in st.hypervisors else cluster.gateway_status(n))
            .get("controller_failovers") for n in cluster.watching()} == moves
    assert {h: cluster.agent_status(h)["whole_configs"] for h in st.hypervisors} == whole


def served_serial(cluster, i: int) -> int | None:
    """The serial number of the certificate replica `i` presents to a new connection."""
    port = cluster.state.controllers[i]["port"]
    ctx = ssl.create_default_context(cafile=cluster.state.ca)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s, \
                ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            return x509.load_der_x509_certificate(t.getpeercert(binary_form=True)).serial_number
    except OSError:
        return None
