"""Everything the agent does to OVSDB, in one module, through the `ovs` IDL (ovsdbapp's connection and commands, as
Neutron's OVS agent uses them): one connection per database, writes as transactions, reads from the IDL's copy of
the tables, and the Interface table's changes pushed to a callback (how a VIF plug is seen without polling).

The agent owns br-int (VM ports + one flow-based VXLAN port) and br-phy (the underlay NIC with the VTEP IP
on its internal port, which the userspace datapath needs to route tunnel packets).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ovs.db.idl import ROW_DELETE
from ovsdbapp.backend.ovs_idl import connection, idlutils
from ovsdbapp.schema.open_vswitch import impl_idl

log = logging.getLogger(__name__)
TUNNEL_PORT = "vxlan0"
AFXDP = "afxdp-nonpmd"  # AF_XDP without PMD threads: the fast port type of the userspace datapath here
# what the IDL mirrors, column by column: what the agent reads or writes and ovsdbapp's commands need. Not the
# Interface statistics and status, which ovs-vswitchd rewrites for every interface every few seconds: mirrored,
# they cost 50 MB and a Python pass over every row at 20,000 ports, for nothing the agent reads.
COLUMNS = {"Open_vSwitch": ["bridges", "cur_cfg", "next_cfg"],
           "Bridge": ["name", "ports", "controller", "datapath_type", "fail_mode", "protocols", "other_config"],
           "Port": ["name", "interfaces"],
           "Interface": ["name", "type", "ofport", "external_ids", "error", "options", "mtu_request"],
           "Controller": ["target", "connection_mode", "max_backoff", "inactivity_probe"]}
TIMEOUT = 10.0  # seconds a transaction may take
Interfaces = tuple[dict[str, int], int | None]  # iface-id -> ofport of plugged VM interfaces; the VXLAN port's


class OvsdbError(RuntimeError):
    pass


class _Idl(connection.OvsdbIdl):
    """The IDL, keeping the Interface rows the agent reads as plain tuples, row by row as they change (reading
    every row's columns through the IDL on each change cost a pass over 2,400 rows per plug), and telling
    `on_interface` (called in the connection's thread, in the middle of an update: it only wakes the reader)."""

    on_interface: Callable[[], None] | None = None

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.ifaces: dict[Any, tuple[str, int, str | None, str]] = {}  # uuid -> (name, ofport, iface-id, type)

    def notify(self, event: str, row: Any, updates: Any = None) -> None:
        if row._table.name != "Interface":
            return
        if event == ROW_DELETE:
            self.ifaces.pop(row.uuid, None)
        else:
            self.ifaces[row.uuid] = (row.name, row.ofport[0] if row.ofport else -1, row.external_ids.get("iface-id"),
                                     row.type)
        if self.on_interface is not None:
            self.on_interface()

    def interface_rows(self) -> list[tuple[str, int, str | None, str]]:
        """The rows held now (a reconnection replaces the table without telling deletions: kept rows only)."""
        live = self.tables["Interface"].rows
        return [v for k, v in self.ifaces.items() if k in live]


_connections: dict[str, tuple[connection.Connection, impl_idl.OvsdbIdl]] = {}
_connections_lock = threading.Lock()


def _connect(remote: str) -> tuple[connection.Connection, impl_idl.OvsdbIdl]:
    """One connection per database in a process (its thread runs the IDL); made on first use."""
    with _connections_lock:
        if remote not in _connections:
            try:
                helper = idlutils.get_schema_helper(remote, "Open_vSwitch")
            except Exception as e:
                raise OvsdbError(f"OVSDB at {remote}: {e} (is ovsdb-server running?)") from e
            for table, columns in COLUMNS.items():
                helper.register_columns(table, columns)
            conn = connection.Connection(_Idl(remote, helper), timeout=TIMEOUT)
            # ovsdbapp keeps a backend's connection on its class (one database per process): a class per database
            api = type(f"OvsdbApi{len(_connections)}", (impl_idl.OvsdbIdl,), {"_ovsdb_connection": None})
            _connections[remote] = (conn, api(conn))
        return _connections[remote]


class Ovsdb:
    def __init__(self, rundir: str | None = None) -> None:
        """`rundir`: a private OVS instance's run directory (emulated hypervisors); else the system's."""
        self.remote = f"unix:{rundir}/db.sock" if rundir else "unix:/var/run/openvswitch/db.sock"
        self.conn, self.api = _connect(self.remote)

    def _run(self, *commands: Any) -> None:
        """The commands in one transaction (all or nothing)."""
        try:
            with self.api.transaction(check_error=True) as txn:
                for c in commands:
                    txn.add(c)
        except Exception as e:
            raise OvsdbError(f"OVSDB transaction on {self.remote}: {e}") from e

    def _rows(self, table: str) -> list[Any]:
        """The IDL's copy of a table, read under the connection's lock (never half an update)."""
        with self.conn.lock:
            return list(self.conn.idl.tables[table].rows.values())

    def _interface(self, name: str) -> Any:
        with self.conn.lock:
            return next((r for r in self.conn.idl.tables["Interface"].rows.values() if r.name == name), None)

    def ensure_bridges(self, *, datapath: str, of_port: int, underlay_if: str, vtep_ip: str) -> None:
        """Idempotent: creates what is missing, never recreates what exists (that would drop traffic)."""
        a = self.api
        self._run(a.add_br("br-int", may_exist=True, datapath_type=datapath),
                  a.db_set("Bridge", "br-int", ("fail_mode", "secure"), ("protocols", ["OpenFlow13"]),
                           ("other_config", {"disable-in-band": "true"})),
                  a.add_br("br-phy", may_exist=True, datapath_type=datapath),
                  a.add_port("br-phy", underlay_if, may_exist=True),
                  a.add_port("br-int", TUNNEL_PORT, may_exist=True),
                  a.db_set("Interface", TUNNEL_PORT, ("type", "vxlan"),
                           ("options", {"remote_ip": "flow", "key": "flow", "local_ip": vtep_ip,
                                        "dst_port": "4789"})))
        target = f"tcp:127.0.0.1:{of_port}"
        if [c.target for c in self._bridge("br-int").controller] != [target]:
            self._run(a.set_controller("br-int", [target]))  # only when it differs: setting it reconnects
        for c in self._bridge("br-int").controller:
            self._run(a.db_set("Controller", c.uuid, ("connection_mode", "out-of-band"), ("max_backoff", 1000),
                               ("inactivity_probe", 5000)))

    def _bridge(self, name: str) -> Any:
        with self.conn.lock:
            return next(b for b in self.conn.idl.tables["Bridge"].rows.values() if b.name == name)

    def underlay(self, ifname: str, mtu: int, want: str) -> str:
        """The underlay NIC's OVS port type, the fastest that works: `afxdp-nonpmd` (AF_XDP without PMD threads,
        measured 2-4x an AF_PACKET port here) unless `want` is "system" or AF_XDP fails on this NIC, then a plain
        `system` port. br-phy and the NIC take the NIC's MTU (a larger underlay carries larger VPC MTUs)."""
        a = self.api
        self._run(a.db_set("Interface", "br-phy", ("mtu_request", mtu)),
                  a.db_set("Interface", ifname, ("mtu_request", mtu)))
        if want in ("auto", "afxdp"):
            self._run(a.db_set("Interface", ifname, ("type", AFXDP)))
            if (why := self.port_error(ifname)) is None:
                return AFXDP
            if want == "afxdp":
                raise OvsdbError(f"{ifname}: AF_XDP port failed ({why}); use --port-type system")
            log.warning("%s: AF_XDP port failed (%s): using a system port", ifname, why)
        self._run(a.db_set("Interface", ifname, ("type", "system")))
        return "system"

    def port_error(self, ifname: str, timeout: float = 5.0) -> str | None:
        """None once ovs-vswitchd has opened the interface (it has an ofport); else why not: its error column, or
        "no ofport" after `timeout`. Read from the IDL's copy, which ovs-vswitchd's answer updates."""
        deadline = time.time() + timeout
        while True:
            row = self._interface(ifname)
            if row is not None:
                if row.error:
                    return row.error[0]
                if row.ofport and row.ofport[0] > 0:
                    return None
            if time.time() > deadline:
                return "no ofport"
            time.sleep(0.01)

    def _iface_rows(self) -> list[tuple[str, int, str | None, str]]:
        with self.conn.lock:
            return self.conn.idl.interface_rows()

    def interfaces(self) -> Interfaces:
        """(iface-id -> ofport for plugged VM interfaces, ofport of the VXLAN port)."""
        return _interfaces(self._iface_rows())

    def vif_types(self) -> dict[str, int]:
        """How many VM interfaces of each OVS port type (`system`: a plain AF_PACKET netdev)."""
        out: dict[str, int] = {}
        for _, _, port_id, typ in self._iface_rows():
            if port_id is not None:
                out[typ or "system"] = out.get(typ or "system", 0) + 1
        return out

    def watch_interfaces(self, changed: Callable[[], None]) -> None:
        """Call `changed` (from the connection's thread: it should only wake its reader) whenever an Interface row
        is inserted, deleted or modified, the initial rows of every (re)connection included."""
        self.conn.idl.on_interface = changed
        changed()

    def plug(self, bridge: str, ifname: str, port_id: str, mac: str | None = None, port_type: str = "system") -> str:
        """Plug a VM interface the way Nova/OVN do (the iface-id names the logical port), as a `port_type` port
        (AFXDP: 2-4x an AF_PACKET port here) if that works, else a `system` one, what every host can do; which."""
        ids = {"iface-id": port_id} | ({"attached-mac": mac} if mac else {})
        self._run(self.api.add_port(bridge, ifname, may_exist=True),
                  self.api.db_set("Interface", ifname, ("external_ids", ids), ("type", port_type)))
        if port_type == "system" or (why := self.port_error(ifname)) is None:
            return port_type
        log.warning("%s: %s port failed (%s): using a system port", ifname, port_type, why)
        self._run(self.api.db_set("Interface", ifname, ("type", "system")))
        return "system"

    def plug_vhost_user(self, bridge: str, ifname: str, port_id: str, mac: str, socket_path: str, mtu: int) -> None:
        """Plug a guest's vhost-user NIC as os-vif does on an OVS-DPDK host: a `dpdkvhostuserclient` port, OVS the
        client of the socket QEMU serves (so either may restart), the iface-id naming the logical port."""
        ids = {"iface-id": port_id, "attached-mac": mac}
        self._run(self.api.add_port(bridge, ifname, may_exist=True),
                  self.api.db_set("Interface", ifname, ("type", "dpdkvhostuserclient"),
                                  ("options", {"vhost-server-path": socket_path}), ("mtu_request", mtu),
                                  ("external_ids", ids)))

    def unplug(self, bridge: str, ifname: str) -> None:
        self._run(self.api.del_port(ifname, bridge=bridge, if_exists=True))


def _interfaces(rows: list[tuple[str, int, str | None, str]]) -> Interfaces:
    ports: dict[str, int] = {}
    tunnel = None
    for name, ofport, port_id, _ in rows:
        if name == TUNNEL_PORT and ofport > 0:
            tunnel = ofport
            continue
        if port_id is not None and ofport > 0:
            ports[port_id] = ofport
    return ports, tunnel


__all__ = ["AFXDP", "TUNNEL_PORT", "Ovsdb", "OvsdbError"]
