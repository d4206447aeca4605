"""Everything the agent does to OVSDB, in one module, through ovs-vsctl.

The agent owns br-int (VM ports + one flow-based VXLAN port) and br-phy (the underlay NIC with the VTEP IP
on its internal port, which the userspace datapath needs to route tunnel packets).
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)
TUNNEL_PORT = "vxlan0"
AFXDP = "afxdp-nonpmd"  # AF_XDP without PMD threads: the fast port type of the userspace datapath here


class OvsdbError(RuntimeError):
    pass


@dataclass
class Ovsdb:
    rundir: str | None = None  # a private OVS instance's run directory (emulated hypervisors)

    def vsctl(self, *args: str, check: bool = True) -> str:
        cmd = ["ovs-vsctl", "--timeout=10"]
        if self.rundir:
            cmd.append(f"--db=unix:{self.rundir}/db.sock")
        r = subprocess.run([*cmd, *args], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise OvsdbError(f"ovs-vsctl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def ensure_bridges(self, *, datapath: str, of_port: int, underlay_if: str, vtep_ip: str) -> None:
        """Idempotent: creates what is missing, never recreates what exists (that would drop traffic)."""
        self.vsctl("--may-exist", "add-br", "br-int", "--", "set", "bridge", "br-int", f"datapath_type={datapath}",
                   "fail_mode=secure", "protocols=OpenFlow13", "other_config:disable-in-band=true")
        target = f"tcp:127.0.0.1:{of_port}"
        if self.vsctl("get-controller", "br-int").split() != [target]:
            self.vsctl("set-controller", "br-int", target)
        self.vsctl("set", "controller", "br-int", "connection_mode=out-of-band", "max_backoff=1000",
                   "inactivity_probe=5000", check=False)
        self.vsctl("--may-exist", "add-br", "br-phy", "--", "set", "bridge", "br-phy", f"datapath_type={datapath}")
        self.vsctl("--may-exist", "add-port", "br-phy", underlay_if)
        self.vsctl("--may-exist", "add-port", "br-int", TUNNEL_PORT, "--", "set", "interface", TUNNEL_PORT,
                   "type=vxlan", "options:remote_ip=flow", "options:key=flow", f"options:local_ip={vtep_ip}",
                   "options:dst_port=4789")

    def underlay(self, ifname: str, mtu: int, want: str) -> str:
        """The underlay NIC's OVS port type, the fastest that works: `afxdp-nonpmd` (AF_XDP without PMD threads,
        measured 2-4x an AF_PACKET port here) unless `want` is "system" or AF_XDP fails on this NIC, then a plain
        `system` port. br-phy and the NIC take the NIC's MTU (a larger underlay carries larger VPC MTUs)."""
        self.vsctl("set", "interface", "br-phy", f"mtu_request={mtu}", "--", "set", "interface", ifname,
                   f"mtu_request={mtu}")
        if want in ("auto", "afxdp"):
            self.vsctl("set", "interface", ifname, f"type={AFXDP}")
            if (why := self.port_error(ifname)) is None:
                return AFXDP
            if want == "afxdp":
                raise OvsdbError(f"{ifname}: AF_XDP port failed ({why}); use --port-type system")
            log.warning("%s: AF_XDP port failed (%s): using a system port", ifname, why)
        self.vsctl("set", "interface", ifname, "type=system")
        return "system"

    def port_error(self, ifname: str, timeout: float = 5.0) -> str | None:
        """None once ovs-vswitchd has opened the interface (it has an ofport); else why not: its error column, or
        "no ofport" after `timeout`."""
        deadline = time.time() + timeout
        while True:
            err = self.vsctl("get", "interface", ifname, "error").strip().strip('"')
            if err not in ("", "[]"):
                return err
            if self.vsctl("get", "interface", ifname, "ofport").strip() not in ("[]", "-1", "0"):
                return None
            if time.time() > deadline:
                return "no ofport"
            time.sleep(0.05)

    def interfaces(self) -> tuple[dict[str, int], int | None]:
        """(iface-id -> ofport for plugged VM interfaces, ofport of the VXLAN port)."""
        out = self.vsctl("--format=json", "--columns=name,ofport,external_ids", "list", "Interface")
        return _interfaces(json.loads(out)["data"])

    def plug(self, bridge: str, ifname: str, port_id: str, mac: str | None = None, port_type: str = "system") -> str:
        """Plug a VM interface the way Nova/OVN do (the iface-id names the logical port), as a `port_type` port
        (AFXDP: 2-4x an AF_PACKET port here) if that works, else a `system` one, what every host can do; which."""
        extra = [f"external_ids:attached-mac={mac}"] if mac else []
        self.vsctl("--may-exist", "add-port", bridge, ifname, "--", "set", "interface", ifname,
                   f"external_ids:iface-id={port_id}", *extra, f"type={port_type}")
        if port_type == "system" or (why := self.port_error(ifname)) is None:
            return port_type
        log.warning("%s: %s port failed (%s): using a system port", ifname, port_type, why)
        self.vsctl("set", "interface", ifname, "type=system")
        return "system"

    def unplug(self, bridge: str, ifname: str) -> None:
        self.vsctl("--if-exists", "del-port", bridge, ifname)


class InterfaceTable:
    """The Interface rows an `ovsdb-client monitor --format=json` stream describes, kept up to date line by line.
    Each line is one update: rows inserted, deleted, or modified (an "old" row with the changed columns, then a
    "new" row with all of them and an empty uuid)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, Any, Any]] = {}  # uuid -> (name, ofport, external_ids)
        self._modified: str | None = None

    def feed(self, line: str) -> bool:
        """Apply one line; False if it is not an update (the monitor's other output)."""
        try:
            msg = json.loads(line)
            heads = msg["headings"]
            data = msg["data"]
        except (ValueError, KeyError, TypeError):
            return False
        col = {h: i for i, h in enumerate(heads)}
        for row in data:
            uuid, action = row[col["row"]], row[col["action"]]
            values = (row[col["name"]], row[col["ofport"]], row[col["external_ids"]], row[col["type"]])
            if action in ("initial", "insert"):
                self.rows[uuid] = values
            elif action == "delete":
                self.rows.pop(uuid, None)
            elif action == "old":
                self._modified = uuid
            elif action == "new" and self._modified is not None:
                self.rows[uuid or self._modified] = values
                self._modified = None
        return True

    def interfaces(self) -> tuple[dict[str, int], int | None]:
        """(iface-id -> ofport for plugged VM interfaces, ofport of the VXLAN port), as `Ovsdb.interfaces`."""
        return _interfaces(self.rows.values())

    def vif_types(self) -> dict[str, int]:
        """How many VM interfaces of each OVS port type (`system`: a plain AF_PACKET netdev)."""
        out: dict[str, int] = {}
        for _, _, ext, typ in self.rows.values():
            if isinstance(ext, list) and ext and ext[0] == "map" and any(k == "iface-id" for k, _ in ext[1]):
                name = typ if isinstance(typ, str) and typ else "system"
                out[name] = out.get(name, 0) + 1
        return out


def _interfaces(rows: Any) -> tuple[dict[str, int], int | None]:
    ports: dict[str, int] = {}
    tunnel = None
    for name, ofport, ext, *_ in rows:
        ofport = ofport if isinstance(ofport, int) else -1
        if name == TUNNEL_PORT and ofport > 0:
            tunnel = ofport
            continue
        ids = dict(ext[1]) if isinstance(ext, list) and ext and ext[0] == "map" else {}
        if "iface-id" in ids and ofport > 0:
            ports[ids["iface-id"]] = ofport
    return ports, tunnel


def monitor_command(rundir: str | None) -> list[str]:
    """Stream every change of the Interface table (initial rows first): how a VIF plug is seen without polling."""
    db = f"unix:{rundir}/db.sock" if rundir else "unix:/var/run/openvswitch/db.sock"
    return ["ovsdb-client", "monitor", db, "Open_vSwitch", "Interface", "name,ofport,external_ids,type",
            "--format=json"]
