"""The agent against real Open vSwitch: two hypervisor namespaces, each with a private ovs-vswitchd."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tests.conftest import Controller
from tests.integration.conftest import Cluster, wait_for


def test_overlay_connectivity_icmp_and_tcp(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    vm2 = cluster.vm("vm2", "hv2")
    vm3 = cluster.vm("vm3", "hv2", subnet=1)
    vm4 = cluster.vm("vm4", "hv1", subnet=1)
    cluster.wait_converged()
    assert cluster.ping(vm1, vm2.ip, count=5)  # same subnet, cross host (first may be lost to VTEP ARP)
    assert cluster.ping(vm1, vm3.ip)  # cross subnet, cross host
    assert cluster.ping(vm1, vm4.ip)  # cross subnet, same host
    # the gateway's ARP was answered in the switch with the VPC's router MAC
    assert cluster.vpc["router_mac"] in vm1.exec("ip", "neigh", "show", "10.0.1.1").stdout
    # TCP through the overlay (what catches checksum and MTU problems): iperf3 for 1 s
    server = vm2.popen("iperf3", "-s", "-1", "-p", "5201", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = vm1.exec("iperf3", "-c", vm2.ip, "-p", "5201", "-t", "1", "-J", timeout=30).stdout
        assert '"bits_per_second"' in out and '"error"' not in out
    finally:
        server.kill()
    # the agents report the ports UP to the controller
    wait_for(lambda: all(p["status"] == "UP" for p in cluster.tenant.get("/v1/ports")), 10, "ports UP")


def test_gateway_arp_and_dhcp(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1", dhcp=False)
    cluster.wait_converged()
    vmd = cluster.vm("vmd", "hv2", dhcp=True)  # dhclient: address, mask, gateway and MTU from the switch
    addr = vmd.exec("ip", "-4", "addr", "show", "eth0").stdout
    assert f"inet {vmd.ip}/24" in addr, addr
    assert "via 10.0.1.1" in vmd.exec("ip", "route").stdout
    assert "mtu 1450" in vmd.exec("ip", "link", "show", "eth0").stdout
    assert cluster.ping(vmd, vm1.ip, count=5)


def test_agent_restart_loses_no_packet(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    vm2 = cluster.vm("vm2", "hv2")
    cluster.wait_converged()
    assert cluster.ping(vm1, vm2.ip, count=5)
    hv1 = cluster.hv["hv1"]

    def restart_agent() -> None:
        cluster.fabric.stop_agent(hv1)
        time.sleep(0.3)
        cluster.fabric.start_agent(hv1, cluster.controller.port, cluster.controller.admin_token)

    cluster.ping_no_loss(vm1, vm2.ip, restart_agent)
    cluster.wait_converged()


def test_flow_deleted_by_hand_comes_back(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    vm2 = cluster.vm("vm2", "hv2")
    cluster.wait_converged()
    assert cluster.ping(vm1, vm2.ip, count=5)
    hv1 = cluster.hv["hv1"]
    flows = hv1.ofctl("dump-flows", "br-int", "table=50")
    line = next(ln for ln in flows.splitlines() if f"nw_dst={vm2.ip}" in ln)
    cookie = re.search(r"cookie=(0x[0-9a-f]+)", line).group(1)
    hv1.ofctl("del-flows", "br-int", f"cookie={cookie}/-1")
    assert f"nw_dst={vm2.ip}" not in hv1.ofctl("dump-flows", "br-int", "table=50")
    wait_for(lambda: f"nw_dst={vm2.ip}" in hv1.ofctl("dump-flows", "br-int", "table=50"), 5, "flow restored")
    # and a flow changed by hand (same cookie, other actions) is put back
    hv1.ofctl("mod-flows", "br-int", f"table=50,cookie={cookie}/-1,ip,metadata={cluster.vpc['vni']},"
              f"nw_dst={vm2.ip},reg0=0,actions=drop")
    wait_for(lambda: "output" in next(ln for ln in hv1.ofctl("dump-flows", "br-int", "table=50").splitlines()
                                      if f"nw_dst={vm2.ip}" in ln), 8, "edited flow restored")
    # a stray flow someone added is removed
    hv1.ofctl("add-flow", "br-int", "table=50,priority=999,ip,actions=drop")
    wait_for(lambda: "priority=999" not in hv1.ofctl("dump-flows", "br-int", "table=50"), 5, "stray flow removed")
    assert cluster.ping(vm1, vm2.ip)


def test_port_rebound_to_other_host_reachable_within_2s(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    mover = cluster.vm("mover", "hv1")
    cluster.wait_converged()
    assert cluster.ping(vm1, mover.ip, count=3)
    port = cluster.tenant.get(f"/v1/ports/{mover.port_id}")
    sn = cluster.subnets[0]
    cluster.fabric.remove_vm(mover)
    t0 = time.monotonic()
    cluster.controller.orchestrator().patch(f"/v1/ports/{mover.port_id}", {"host": "hv2"})
    moved = cluster.fabric.add_vm("mover", cluster.hv["hv2"], port | {"gateway_ip": sn["gateway_ip"]})

    def reachable() -> bool:
        return vm1.exec("ping", "-c", "1", "-W", "0.2", moved.ip, check=False).returncode == 0

    wait_for(reachable, 2.0, "migrated port reachable", interval=0.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0, elapsed


def test_isolation_and_security_groups_on_the_wire(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    vm2 = cluster.vm("vm2", "hv2")
    # another tenant with the same CIDR and the same IPs
    other = cluster.controller.tenant("globex")
    ovpc = other.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    osn = other.post("/v1/subnets", {"vpc_id": ovpc["id"], "name": "s1", "cidr": "10.0.1.0/24"})
    oport = cluster.controller.orchestrator().post("/v1/ports", {"subnet_id": osn["id"], "name": "x", "host": "hv2",
                                                                 "ip": "10.0.1.50"})
    ovm = cluster.fabric.add_vm("ovm", cluster.hv["hv2"], oport | {"gateway_ip": "10.0.1.1"})
    cluster.wait_converged()
    assert cluster.ping(vm1, vm2.ip, count=5)
    assert not cluster.ping(vm1, ovm.ip, count=2)  # other tenant's VM: unreachable
    assert not cluster.ping(ovm, vm2.ip, count=2)
    # security group: a web group allows tcp/8080 from anywhere; default group members reach everything
    sg = cluster.tenant.post("/v1/security-groups", {"vpc_id": cluster.vpc["id"], "name": "web", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 8080, "port_range_max": 8080},
        {"direction": "egress", "protocol": "any"}]})
    cluster.tenant.patch(f"/v1/ports/{vm2.port_id}", {"security_group_ids": [sg["id"]]})
    cluster.wait_converged()
    # socketserver, not `python -m http.server`: the latter blocks on a reverse DNS lookup before listening
    web = ("import http.server, socketserver; socketserver.TCPServer(('" + vm2.ip + "', 8080), "
           "http.server.SimpleHTTPRequestHandler).serve_forever()")
    server = vm2.popen(sys.executable, "-c", web, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: vm1.exec("curl", "-s", "-m", "1", f"http://{vm2.ip}:8080/", check=False).returncode == 0,
                 8, "web server reachable on the allowed port")
        assert not cluster.ping(vm1, vm2.ip, count=2)  # ICMP is not allowed in by the web group
        # removing the rule stops new connections
        rule = next(r for r in cluster.tenant.get(f"/v1/security-groups/{sg['id']}")["rules"]
                    if r["direction"] == "ingress")
        cluster.tenant.delete(f"/v1/security-groups/{sg['id']}/rules/{rule['id']}")
        cluster.wait_converged()
        assert vm1.exec("curl", "-s", "-m", "1", f"http://{vm2.ip}:8080/", check=False).returncode != 0
    finally:
        server.kill()


def test_controller_restart_leaves_data_plane_untouched(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    vm2 = cluster.vm("vm2", "hv2")
    cluster.wait_converged()
    assert cluster.ping(vm1, vm2.ip, count=5)
    before = {h: cluster.fabric.agent_status(hv)["flow_deletes"] for h, hv in cluster.hv.items()}
    old = cluster.controller

    def restart_controller() -> None:
        old.stop()  # the controller is gone while traffic flows
        time.sleep(1.0)
        cluster.controller = Controller(old.settings.state_dir, None, listen="0.0.0.0", port=old.port)

    cluster.ping_no_loss(vm1, vm2.ip, restart_controller)
    cluster.wait_converged()
    after = {h: cluster.fabric.agent_status(hv)["flow_deletes"] for h, hv in cluster.hv.items()}
    assert after == before  # nothing was torn down and rebuilt
    # and the restarted controller drives the agents: a new port is reachable
    vm3 = cluster.vm("vm3", "hv2", subnet=1)
    cluster.wait_converged()
    assert cluster.ping(vm1, vm3.ip)


def _many_remote_ports(cluster: Cluster, n: int, subnet: int = 1) -> None:
    """n ports on hv2 without VMs: every one is ARP, delivery and security-group flows on hv1."""
    sn = cluster.subnets[subnet]
    for i in range(0, n, 100):
        ports = [{"subnet_id": sn["id"], "name": f"r{j}", "host": "hv2"} for j in range(i, min(n, i + 100))]
        cluster.controller.orchestrator().post("/v1/ports/bulk", {"ports": ports})


def test_switch_crash_during_a_large_change_converges_without_restart(cluster: Cluster) -> None:
    """ovs-vswitchd killed and restarted while the agent programs a large change: the new switch has no flows;
    the agent reconnects, reads it back, installs everything, and says so truthfully."""
    vm1 = cluster.vm("vm1", "hv1")
    vm2 = cluster.vm("vm2", "hv2")
    cluster.wait_converged()
    hv1 = cluster.hv["hv1"]
    _many_remote_ports(cluster, 200)
    connects = cluster.fabric.agent_status(hv1).get("connects", 0)
    cluster.fabric.restart_ovs(hv1, "ovs-vswitchd")
    wait_for(lambda: cluster.fabric.agent_status(hv1).get("connects", 0) > connects, 20, "the agent to reconnect")
    _many_remote_ports(cluster, 100, subnet=0)
    cluster.wait_converged(timeout=60)
    assert cluster.switch_matches(hv1) == (0, 0)
    assert cluster.ping(vm1, vm2.ip, count=5)


def test_forced_disconnect_mid_change_and_status_tells_the_truth(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    vm2 = cluster.vm("vm2", "hv2")
    cluster.wait_converged()
    hv1 = cluster.hv["hv1"]
    target = hv1.vsctl("get-controller", "br-int").strip()
    _many_remote_ports(cluster, 150)
    hv1.vsctl("del-controller", "br-int")
    wait_for(lambda: cluster.fabric.agent_status(hv1).get("switch_connected") is False, 10,
             "the status to say the switch is disconnected")
    # (removing a bridge's last controller makes Open vSwitch flush its flows: the reconnect finds it empty)
    _many_remote_ports(cluster, 100, subnet=0)  # changes while disconnected
    hv1.vsctl("set-controller", "br-int", target)
    cluster.wait_converged(timeout=60)
    assert cluster.switch_matches(hv1) == (0, 0)
    # and again, this time while a change is being sent
    _many_remote_ports(cluster, 100)
    hv1.vsctl("del-controller", "br-int")
    time.sleep(0.2)
    hv1.vsctl("set-controller", "br-int", target)
    cluster.wait_converged(timeout=60)
    assert cluster.switch_matches(hv1) == (0, 0)
    assert cluster.ping(vm1, vm2.ip, count=3)


def test_ovsdb_restart_then_a_plug_is_still_seen(cluster: Cluster) -> None:
    vm1 = cluster.vm("vm1", "hv1")
    cluster.wait_converged()
    hv1 = cluster.hv["hv1"]
    cluster.fabric.restart_ovs(hv1, "ovsdb-server")
    time.sleep(1.0)
    vm3 = cluster.vm("vm3", "hv1", subnet=1)  # plugged through the restarted database
    cluster.wait_converged(timeout=30)
    assert cluster.ping(vm1, vm3.ip, count=3)
    assert cluster.switch_matches(hv1) == (0, 0)
