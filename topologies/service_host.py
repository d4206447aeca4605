"""The cluster's services on the service network, as the emulation runs them (`python -m topologies.service_host`):
an object store over HTTP, and a database-like TCP service that asks for PROXY protocol v2.

* The store (`--store ADDR:PORT`): `GET /objects/NAME` answers the object (`PUT` stores one), `GET /whoami` the
  source address the connection came from (an endpoint's own address on the service network: what tells tenants
  apart when a service does not ask for PROXY headers).
* The database (`--db ADDR:PORT`): every connection must begin with a PROXY v2 header (refused otherwise); the
  server speaks first, `READY endpoint=ID vm=ADDRESS source=ADDRESS`, then answers each line `OK <line>`. On UDP,
  the same port: every datagram must begin with the header; the answer is `READY ... | OK <payload>`.
"""

from __future__ import annotations

import argparse
import http.server
import socket
import socketserver
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from nfv_gateways.roles.service import proxy_protocol as pp
from topologies.machines import spawn

if TYPE_CHECKING:
    from topologies.cluster_state import State

OBJECTS: dict[str, bytes] = {"hello.txt": b"hello from the cluster's object store\n"}


class Store(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # connections kept open between requests
    def do_GET(self) -> None:
        if self.path == "/whoami":
            return self._send(200, self.client_address[0].encode())
        name = self.path.removeprefix("/objects/")
        if self.path.startswith("/objects/") and name in OBJECTS:
            return self._send(200, OBJECTS[name])
        return self._send(404, b"no such object\n")

    def do_PUT(self) -> None:
        name = self.path.removeprefix("/objects/")
        OBJECTS[name] = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(201, b"stored\n")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


class Db(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        data = b""
        while len(data) < 16 or (len(data) < 16 + int.from_bytes(data[14:16], "big")):
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
            if len(data) >= 12 and not data.startswith(pp.SIGNATURE[:len(data)]):
                self.request.sendall(b"ERROR no PROXY v2 header\n")
                return
        h = pp.parse(data)
        if h is None:
            self.request.sendall(b"ERROR bad PROXY v2 header\n")
            return
        endpoint = h["tlvs"].get(pp.PP2_TYPE_AWS, b"\x01?")[1:].decode()
        vm = socket.inet_ntoa(h["src"].to_bytes(4, "big"))
        self.request.sendall(f"READY endpoint={endpoint} vm={vm} source={self.client_address[0]}\n".encode())
        rest = data[h["length"]:]
        f = self.request.makefile("rb")
        if rest:
            self.request.sendall(b"OK " + rest.split(b"\n")[0] + b"\n")
        for line in f:
            self.request.sendall(b"OK " + line)


class DbDatagrams(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data, sock = self.request
        h = pp.parse(data)
        if h is None or h["transport"] != "udp":
            sock.sendto(b"ERROR no PROXY v2 header\n", self.client_address)
            return
        endpoint = h["tlvs"].get(pp.PP2_TYPE_AWS, b"\x01?")[1:].decode()
        vm = socket.inet_ntoa(h["src"].to_bytes(4, "big"))
        line = data[h["length"]:].split(b"\n")[0].decode(errors="replace")
        sock.sendto(f"READY endpoint={endpoint} vm={vm} source={self.client_address[0]} | OK {line}\n".encode(),
                    self.client_address)


def start_all(st: State) -> None:
    """The services of every service host of the cluster (`st`), each in its namespace, stopped with it."""
    for n, info in st.nodes.items():
        if info["role"] == "service-host":
            args = [f"--{kind}={where}" for kind, where in sorted(info["services"].items())]
            info["pid"] = spawn(info["ns"], [sys.executable, "-m", "topologies.service_host", *args],
                                Path(st.dir) / f"services-{n}.log")
            st.pids.append(info["pid"])
            st.save()


def address_of(st: State, kind: str) -> tuple[str, int]:
    for i in st.nodes.values():
        if kind in i.get("services", {}):
            host, port = i["services"][kind].rsplit(":", 1)
            return host, int(port)
    raise KeyError(f"no service host runs {kind!r} in this topology")


class Threaded(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="ADDR:PORT of the object store")
    ap.add_argument("--db", help="ADDR:PORT of the database-like service (PROXY v2)")
    a = ap.parse_args()
    servers: list[socketserver.BaseServer] = []
    if a.store:
        host, port = a.store.rsplit(":", 1)
        servers.append(http.server.ThreadingHTTPServer((host, int(port)), Store))
    if a.db:
        host, port = a.db.rsplit(":", 1)
        servers.append(Threaded((host, int(port)), Db))
        servers.append(socketserver.ThreadingUDPServer((host, int(port)), DbDatagrams))
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("serving", flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
