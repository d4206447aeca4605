"""The tianji-cni plugin driven exactly as a container runtime drives it (the spec's CNI_* environment, the
network configuration on stdin, a network namespace per container; what the CNI project's `cnitool` does), against
a real controller, real Open vSwitch and the agent on two emulated hypervisors.

ADD makes a working interface in the VPC (a VM on the other hypervisor reaches it); a retried ADD adopts the same
port; CHECK finds what changed; DEL removes port, interface and flows, also twice and after a failed ADD; DEL with
the controller unreachable removes the local side and deletes the port later; GC removes what the runtime no longer
lists; STATUS and VERSION answer; every error is a CNI error object with its code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import wait_for
from topologies.netns import add as netns_add
from topologies.netns import delete as netns_delete

PLUGIN = [sys.executable, "-m", "tianji_cni.main"]


@pytest.fixture
def cni(cluster, tmp_path: Path):
    """Run the plugin: (command, container id, netns, overrides of the config) -> (exit status, JSON or None,
    stderr). Namespaces made here are removed after the test."""
    made: list[str] = []
    token = cluster.controller.orchestrator().token
    hv = cluster.hv["hv1"]
    base = {"cniVersion": "1.0.0", "name": "tianji-web", "type": "tianji-cni", "controller": cluster.controller.url,
            "token": token, "subnet_id": cluster.subnets[0]["id"], "host": "hv1", "ovs_rundir": str(hv.rundir),
            "netns": hv.ns, "state_dir": str(tmp_path / "cni-state"), "wait_up_s": 20}

    def netns() -> str:
        name = netns_add(f"tjc-{uuid.uuid4().hex[:6]}")
        made.append(name)
        return f"/run/netns/{name}"

    def run(command: str, container: str = "", ns: str = "", conf: dict | None = None, ifname: str = "eth0",
            raw_stdin: str | None = None) -> tuple[int, dict | None, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")} | {
            "CNI_COMMAND": command, "CNI_CONTAINERID": container, "CNI_NETNS": ns, "CNI_IFNAME": ifname,
            "CNI_PATH": "/opt/cni/bin"}
        stdin = raw_stdin if raw_stdin is not None else json.dumps(base | (conf or {}))
        r = subprocess.run(PLUGIN, input=stdin, capture_output=True, text=True, env=env, timeout=60)
        return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None, r.stderr

    run.netns = netns  # type: ignore[attr-defined]
    run.base = base  # type: ignore[attr-defined]
    yield run
    netns_delete(made)


def ports_of(cluster, container: str) -> list[dict]:
    return [p for p in cluster.controller.admin.get("/v1/ports", subnet_id=cluster.subnets[0]["id"])
            if any(t.startswith(f"cni:{container[:40]}/") for t in p.get("tags", []))]


def in_ns(ns: str, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", f"--net={ns}", *cmd], capture_output=True, text=True, timeout=30)


def test_add_makes_a_working_interface_check_verifies_and_del_removes_everything(cluster, cni) -> None:
    ns, cid = cni.netns(), uuid.uuid4().hex * 2
    rc, res, err = cni("ADD", cid, ns)
    assert rc == 0, (res, err)
    (port,) = ports_of(cluster, cid)
    assert port["host"] == "hv1" and port["status"] == "UP"
    assert res["cniVersion"] == "1.0.0"
    assert res["interfaces"] == [{"name": "eth0", "mac": port["mac"], "sandbox": ns, "mtu": 1450}]
    assert res["ips"] == [{"address": f"{port['ip']}/24", "gateway": "10.0.1.1", "interface": 0}]
    assert {"dst": "0.0.0.0/0", "gw": "10.0.1.1"} in res["routes"]
    link = in_ns(ns, "ip", "-o", "link", "show", "eth0").stdout
    assert "mtu 1450" in link and port["mac"] in link
    # the container is in the VPC: a VM on the other hypervisor reaches it, and it reaches the VM
    vm = cluster.vm("peer", "hv2")
    cluster.wait_converged()
    wait_for(lambda: cluster.ping(vm, port["ip"], count=1), 15, "the VM reaching the container")
    assert vm.ip and in_ns(ns, "ping", "-c", "2", "-W", "1", vm.ip).returncode == 0
    assert cni("CHECK", cid, ns)[0] == 0
    in_ns(ns, "ip", "addr", "flush", "dev", "eth0")  # someone took the address away: CHECK says so
    rc, res, _ = cni("CHECK", cid, ns)
    assert rc == 1 and res["code"] == 101 and f"does not hold {port['ip']}/24" in res["msg"], res

    hv = cluster.hv["hv1"]
    assert cni("DEL", cid, ns)[0] == 0
    assert ports_of(cluster, cid) == []
    assert in_ns(ns, "ip", "link", "show", "eth0").returncode != 0
    assert f"tc{port['id'][:11]}" not in hv.vsctl("list-ports", "br-int")
    wait_for(lambda: port["mac"] not in hv.ofctl("dump-flows", "br-int"), 10, "the port's flows gone from hv1")
    rc, res, _ = cni("DEL", cid, ns)  # twice: nothing left, still success
    assert rc == 0 and res is None


def test_add_again_adopts_the_same_port(cluster, cni) -> None:
    ns, cid = cni.netns(), uuid.uuid4().hex
    assert cni("ADD", cid, ns)[0] == 0
    first = ports_of(cluster, cid)
    rc, res, err = cni("ADD", cid, ns)  # the runtime retried, or the container restarted in place
    assert rc == 0, (res, err)
    assert ports_of(cluster, cid) == first and len(first) == 1
    assert res["interfaces"][0]["mac"] == first[0]["mac"]
    assert cni("DEL", cid, ns)[0] == 0


def test_del_after_a_failed_add_leaves_nothing(cluster, cni) -> None:
    cid = uuid.uuid4().hex
    rc, res, _ = cni("ADD", cid, "/run/netns/tjc-no-such-namespace")
    assert rc == 1 and res["code"] == 101, res
    rc, res, _ = cni("DEL", cid, "/run/netns/tjc-no-such-namespace")
    assert rc == 0
    assert ports_of(cluster, cid) == []
    assert not [p for p in cluster.hv["hv1"].vsctl("list-ports", "br-int").split() if p.startswith("tc")]


def test_del_with_the_controller_unreachable_cleans_up_here_and_deletes_the_port_later(cluster, cni) -> None:
    ns, cid = cni.netns(), uuid.uuid4().hex
    assert cni("ADD", cid, ns)[0] == 0
    (port,) = ports_of(cluster, cid)
    rc, res, err = cni("DEL", cid, ns, {"controller": "http://127.0.0.1:9", "timeout_s": 2})
    assert rc == 0, (res, err)
    assert "unreachable" in err and port["id"] in err and "retried" in err
    assert in_ns(ns, "ip", "link", "show", "eth0").returncode != 0
    assert f"tc{port['id'][:11]}" not in cluster.hv["hv1"].vsctl("list-ports", "br-int")
    assert ports_of(cluster, cid) != []  # the controller never heard: the port is still there ...
    assert cni("STATUS")[0] == 0  # ... until the plugin runs again with the controller answering
    assert ports_of(cluster, cid) == []


def test_gc_removes_the_ports_the_runtime_no_longer_lists(cluster, cni) -> None:
    keep, drop = uuid.uuid4().hex, uuid.uuid4().hex
    ns1, ns2 = cni.netns(), cni.netns()
    assert cni("ADD", keep, ns1)[0] == 0 and cni("ADD", drop, ns2)[0] == 0
    rc, res, err = cni("GC", conf={"cniVersion": "1.1.0",
                                   "cni.dev/valid-attachments": [{"containerID": keep, "ifname": "eth0"}]})
    assert rc == 0, (res, err)
    assert len(ports_of(cluster, keep)) == 1 and ports_of(cluster, drop) == []
    assert cni("DEL", keep, ns1)[0] == 0


def test_version_status_and_errors_are_cni_objects(cluster, cni) -> None:
    rc, res, _ = cni("VERSION", raw_stdin="")
    assert rc == 0 and "1.0.0" in res["supportedVersions"] and "1.1.0" in res["supportedVersions"]
    assert cni("STATUS")[0] == 0
    rc, res, _ = cni("STATUS", conf={"controller": "http://127.0.0.1:9", "timeout_s": 2})
    assert rc == 1 and res["code"] == 50 and "cannot add containers" in res["msg"]
    rc, res, _ = cni("ADD", "c", "/run/netns/x", {"cniVersion": "0.1.0"})
    assert rc == 1 and res["code"] == 1 and "0.1.0" in res["msg"]
    bad = dict(cni.base)
    del bad["subnet_id"]
    rc, res, _ = cni("ADD", "c", "/run/netns/x", raw_stdin=json.dumps(bad))
    assert rc == 1 and res["code"] == 4 and "subnet_id" in res["msg"]
    rc, res, _ = cni("ADD", "", "/run/netns/x")
    assert rc == 1 and res["code"] == 7 and "CNI_CONTAINERID" in res["msg"]
    rc, res, _ = cni("ADD", "c", cni.netns(), {"subnet_id": str(uuid.uuid4())})
    assert rc == 1 and res["code"] == 100 and "404" in res["msg"]
    rc, res, _ = cni("ADD", "c", "/run/netns/x", raw_stdin="{not json")
    assert rc == 1 and res["code"] == 6


def test_the_plugin_is_installed_where_runtimes_look(cluster) -> None:
    """`make setup` puts tianji-cni into /opt/cni/bin (and the wheel carries its console script)."""
    path = Path("/opt/cni/bin/tianji-cni")
    assert path.exists() and os.access(path, os.X_OK), "run `make setup`: it installs /opt/cni/bin/tianji-cni"
    r = subprocess.run([str(path)], env={"CNI_COMMAND": "VERSION", "PATH": os.environ["PATH"]},
                       capture_output=True, text=True, input="")
    assert r.returncode == 0 and "1.0.0" in json.loads(r.stdout)["supportedVersions"]
    assert shutil.which("nsenter") and shutil.which("ovs-vsctl")
