"""The libvirt path, as Nova drives it: a libvirt domain on a hypervisor with
`<virtualport type='openvswitch'><parameters interfaceid='PORT_ID'/>` and nothing else of Tianji is plugged by libvirt
itself (its own ovs-vsctl transaction) and programmed by the agent: the guest's DHCP client gets the port's address
and MTU, the port goes UP, and the guest reaches a VM on another hypervisor (ICMP and TCP)."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.scenarios.conftest import WEB, ex, wait_for
from topologies import libvirt_host
from topologies.guest_image import build
from topologies.guests import GuestConsole, accel


def test_a_libvirt_domain_is_plugged_by_iface_id_and_programmed(cluster, tenants) -> None:
    import subprocess
    import sys

    n = tenants()
    vpc = n.vpc("prod", "10.75.0.0/16", {"s": "10.75.1.0/24"})
    n.client.post(f"/v1/security-groups/{vpc['default_security_group_id']}/rules",
                  {"direction": "ingress", "protocol": "any", "remote_cidr": "10.75.0.0/16"})
    vm = n.vm("s", "hv2", dhcp=True)
    port = n.client.post("/v1/ports", {"subnet_id": n.subnets["s"]["id"], "name": "libvirt-vm"})
    cluster.orchestrator.patch(f"/v1/ports/{port['id']}", {"host": "hv1"})  # as Nova binds it
    base = libvirt_host.start(cluster, "hv1")
    image = build(lambda m: None)
    name = f"lv{uuid.uuid4().hex[:6]}"
    console = Path(cluster.state.dir) / "libvirt" / f"{name}.console"
    xml = libvirt_host.domain_xml(name, port["id"], port["mac"], image, console, accel(image, lambda m: None))
    interface = xml[xml.index("<interface"):xml.index("</interface>")]
    assert "tianji" not in interface.lower()  # the network's part is plain libvirt: the port id, nothing more
    (base / f"{name}.xml").write_text(xml)
    libvirt_host.virsh(base, "create", str(base / f"{name}.xml"))
    try:
        hv1 = cluster.hypervisor("hv1")
        row = hv1.vsctl("--columns=name,external_ids", "find", "Interface", f"external_ids:iface-id={port['id']}")
        assert f'attached-mac="{port["mac"]}"' in row and "iface-status=active" in row and "vm-id=" in row, row
        wait_for(lambda: n.client.get(f"/v1/ports/{port['id']}")["status"] == "UP", 30, "the port UP on hv1")
        c = GuestConsole(console, timeout=60)
        try:
            def bound() -> str:
                rc, out = c.run("cat /tmp/dhcp-bound 2>/dev/null")
                return out.strip()

            wait_for(lambda: bound() == port["ip"], 60, "the libvirt guest's DHCP answer")
            assert "mtu 1450" in c.run("ip -o link show eth0")[1]
            wait_for(lambda: c.run(f"ping -c 1 -W 1 {vm['ip']}")[0] == 0, 15, "the guest reaching the VM on hv2")
            srv = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 8080],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_for(lambda: c.run(f"fetch http://{vm['ip']}:8080/")[1].strip() == port["ip"], 15,
                         "TCP from the libvirt guest to the VM")
            finally:
                srv.kill()
                srv.wait()
        finally:
            c.close()
        assert ex(cluster, vm, "ping", "-c", "1", "-W", "1", port["ip"]).returncode == 0
    finally:
        libvirt_host.virsh(base, "destroy", name, check=False)
    wait_for(lambda: port["mac"] not in hv1.vsctl("--columns=external_ids", "list", "Interface"), 10,
             "libvirt unplugging the interface when the domain stops")
