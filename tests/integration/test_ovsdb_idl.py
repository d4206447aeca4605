"""The agent's OVSDB client on a real ovsdb-server and ovs-vswitchd: bridges made idempotently, a VIF plug and
unplug pushed to the watcher (no polling, no subprocess), its ofport and port type read from the IDL's copy, and
the watch surviving an ovsdb-server restart, and two databases in one process kept apart."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from topologies import netns
from topologies.hosts import wait_gone
from topologies.machines import start_ovs_daemon, start_private_ovs
from vswitch_agent.ovsdb import TUNNEL_PORT, Ovsdb


def wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_bridges_plug_watch_and_restart(tmp_path: Path) -> None:
    ns = netns.add("tjidl")
    pids: list[int] = []
    try:
        netns.veth("ul0", ns, "ul1", ns)
        netns.veth("tap1", ns, "vm1", ns)
        rundir = tmp_path / "ovs"
        pids = start_private_ovs(ns, rundir)
        db = Ovsdb(str(rundir))
        for _ in range(2):  # idempotent: the second time changes nothing
            db.ensure_bridges(datapath="netdev", of_port=6653, underlay_if="ul0", vtep_ip="172.31.0.1")
        assert db.underlay("ul0", 1500, "system") == "system"
        woke = threading.Event()
        db.watch_interfaces(woke.set)
        wait(lambda: db.interfaces()[1] is not None)  # the VXLAN port has its ofport
        woke.clear()
        assert db.plug("br-int", "tap1", "port-1", "02:00:00:00:00:01") == "system"
        wait(woke.is_set)
        wait(lambda: "port-1" in db.interfaces()[0])
        ports, tunnel = db.interfaces()
        assert ports["port-1"] > 0 and tunnel > 0 and ports["port-1"] != tunnel
        assert db.vif_types() == {"system": 1}
        # ovsdb-server restarts: the IDL reconnects and the watcher is told again
        old = int((rundir / "ovsdb-server.pid").read_text())
        os.kill(old, signal.SIGKILL)
        wait_gone(old, time.time() + 5)
        (rundir / "ovsdb-server.pid").unlink(missing_ok=True)
        woke.clear()
        start_ovs_daemon("ovsdb-server", ns, rundir)
        pids = [int((rundir / p).read_text()) for p in ("ovsdb-server.pid", "ovs-vswitchd.pid")]
        wait(woke.is_set)
        db.unplug("br-int", "tap1")
        wait(lambda: "port-1" not in db.interfaces()[0])
        assert TUNNEL_PORT not in db.interfaces()[0]
        # a second database in the same process (the cluster harness plugs into every hypervisor's) is its own
        other = tmp_path / "other"
        other.mkdir()
        netns.sh("ovsdb-tool", "create", str(other / "conf.db"), "/usr/share/openvswitch/vswitch.ovsschema")
        start_ovs_daemon("ovsdb-server", ns, other)
        pids.append(int((other / "ovsdb-server.pid").read_text()))
        netns.sh("ovs-vsctl", f"--db=unix:{other}/db.sock", "--no-wait", "init")
        db2 = Ovsdb(str(other))
        assert db2.api.ovsdb_connection is not db.api.ovsdb_connection
        wait(lambda: db2._rows("Open_vSwitch"))  # connected, its rows mirrored
        assert {b.name for b in db2._rows("Bridge")} == set() and {b.name for b in db._rows("Bridge")} == \
            {"br-int", "br-phy"}
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        netns.delete([ns])
