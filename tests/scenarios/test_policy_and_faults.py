"""Scenarios 6-8: security groups, migration, faults."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tests.scenarios.conftest import ex, ping, reach, wait_for


def web_server(cluster, vm: dict, port: int = 8080) -> subprocess.Popen:
    # socketserver, not `python -m http.server`: the latter blocks on reverse DNS before listening
    code = ("import http.server, socketserver; socketserver.TCPServer(('%s', %d), "
            "http.server.SimpleHTTPRequestHandler).serve_forever()") % (vm["ip"], port)
    p = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", code], cwd="/tmp",
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: f"{vm['ip']}:{port}" in ex(cluster, vm, "ss", "-ltn").stdout, 5, "web server listening")
    return p


def curl(cluster, vm: dict, url: str) -> bool:
    return ex(cluster, vm, "curl", "-s", "-o", "/dev/null", "-m", "1", url).returncode == 0


def test_6_security_groups(cluster, tenants) -> None:
    a = tenants()
    vpc = a.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    web = a.client.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "web", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 8080, "port_range_max": 8080},
        {"direction": "egress", "protocol": "tcp", "port_range_min": 8080, "port_range_max": 8080}]})
    client = a.client.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "client", "rules": [
        {"direction": "egress", "protocol": "any"}]})
    srv = a.vm("s", "hv1", security_group_ids=[web["id"]])
    cli = a.vm("s", "hv2", security_group_ids=[client["id"]])
    cluster.wait_converged()
    p = web_server(cluster, srv)
    try:
        # allowed outbound TCP from the client gets its replies (the client group has no ingress rule at all)
        wait_for(lambda: curl(cluster, cli, f"http://{srv['ip']}:8080/"), 8, "allowed TCP with replies")
        # unsolicited inbound to the client is dropped: the server (egress only to 8080) cannot ping it
        assert not ping(cluster, srv, cli["ip"], count=2)
        p2 = web_server(cluster, cli, 8080)
        assert curl(cluster, srv, f"http://{cli['ip']}:8080/") is False  # egress allowed, client ingress not
        p2.kill()
        # a removed rule stops new connections
        rule = next(r for r in a.client.get(f"/v1/security-groups/{web['id']}")["rules"]
                    if r["direction"] == "ingress")
        a.client.delete(f"/v1/security-groups/{web['id']}/rules/{rule['id']}")
        cluster.wait_converged()
        assert not curl(cluster, cli, f"http://{srv['ip']}:8080/")
        # remote-group rules follow membership: allow 8080 from members of the client group only
        a.client.post(f"/v1/security-groups/{web['id']}/rules", {"direction": "ingress", "protocol": "tcp",
                                                                 "port_range_min": 8080, "port_range_max": 8080,
                                                                 "remote_group_id": client["id"]})
        cluster.wait_converged()
        wait_for(lambda: curl(cluster, cli, f"http://{srv['ip']}:8080/"), 5, "member of the remote group allowed")
        other = a.vm("s", "hv3", security_group_ids=[vpc["default_security_group_id"]])
        cluster.wait_converged()
        assert not curl(cluster, other, f"http://{srv['ip']}:8080/")  # not a member
        a.client.patch(f"/v1/ports/{other['port_id']}", {"security_group_ids": [client["id"]]})
        cluster.wait_converged()
        wait_for(lambda: curl(cluster, other, f"http://{srv['ip']}:8080/"), 5, "new member allowed")
        a.client.patch(f"/v1/ports/{cli['port_id']}", {"security_group_ids": [vpc["default_security_group_id"]]})
        cluster.wait_converged()
        assert not curl(cluster, cli, f"http://{srv['ip']}:8080/")  # left the group
    finally:
        p.kill()


def test_7_migration_reachable_within_2s(cluster, tenants) -> None:
    a = tenants()
    a.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    peer = a.vm("s", "hv1")
    mover = a.vm("s", "hv2", dhcp=False)
    assert reach(cluster, peer, mover["ip"])
    cluster.vm_remove(mover["name"])  # the VM stops on hv2 ...
    t0 = time.monotonic()
    cluster.orchestrator.patch(f"/v1/ports/{mover['port_id']}", {"host": "hv3"})  # ... the port is rebound ...
    moved = cluster.vm_add(mover["port_id"], mover["name"] + "m", dhcp=False)  # ... and re-plugged on hv3
    a.vms.append(moved["name"])
    wait_for(lambda: ex(cluster, peer, "ping", "-c", "1", "-W", "0.2", moved["ip"]).returncode == 0, 2.0,
             "the migrated VM reachable", interval=0)
    assert time.monotonic() - t0 < 2.0


def test_8_faults(cluster, tenants) -> None:
    a = tenants()
    a.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    v1, v2 = a.vm("s", "hv1"), a.vm("s", "hv2")
    assert reach(cluster, v1, v2["ip"])

    def pinging() -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", v1["ns"], "ping", "-c", "100", "-i", "0.02", "-W", "1",
                                 v2["ip"]], stdout=subprocess.PIPE, text=True)

    def no_loss(p: subprocess.Popen) -> None:
        out, _ = p.communicate(timeout=60)
        m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        assert m and m.group(1) == m.group(2) == "100", out

    # an agent killed and restarted during a ping loses no packet
    p = pinging()
    time.sleep(0.3)
    cluster.kill_agent("hv1")
    cluster.start_agent("hv1")
    no_loss(p)
    cluster.wait_agents()
    # restarting the controller leaves the data plane untouched
    flows_before = {h: cluster.agent_status(h).get("flow_deletes") for h in ("hv1", "hv2")}
    p = pinging()
    cluster.restart_controller(down_for=0.5)
    no_loss(p)
    cluster.wait_agents()
    assert {h: cluster.agent_status(h).get("flow_deletes") for h in ("hv1", "hv2")} == flows_before
    # a hypervisor that dies is marked down and its ports DOWN
    wait_for(lambda: a.client.get(f"/v1/ports/{v2['port_id']}")["status"] == "UP", 10, "port UP")
    cluster.kill_agent("hv2")
    wait_for(lambda: cluster.admin.get("/v1/hosts/hv2")["status"] == "down", 15, "hv2 marked down")
    assert a.client.get(f"/v1/ports/{v2['port_id']}")["status"] == "DOWN"
    cluster.start_agent("hv2")
    wait_for(lambda: cluster.admin.get("/v1/hosts/hv2")["status"] == "up", 15, "hv2 back up")
    wait_for(lambda: a.client.get(f"/v1/ports/{v2['port_id']}")["status"] == "UP", 10, "port UP again")
    assert reach(cluster, v1, v2["ip"])
