"""`tianji-cni`: a CNI plugin (spec 1.0.0; 1.1.0's GC and STATUS) that puts a container into a tenant's VPC.

The runtime runs it with `CNI_COMMAND` and the network's configuration on stdin:
- ADD creates the container's port in the configured subnet (or adopts it: the same container and interface
  again), binds it to this host, makes the container's interface with the port's MAC, address, routes and MTU,
  plugs it into the integration bridge by `iface-id`, waits until the host reports the port UP, and prints the
  result;
- DEL unplugs and deletes the port; it always succeeds: with the controller unreachable the local side is removed
  and the port's deletion is kept and retried by the plugin's next run (GC included), which stderr says;
- CHECK verifies interface, address and binding; GC deletes this network's ports on this host that the runtime
  no longer knows; STATUS says whether the controller answers; VERSION answers.

The network configuration: `controller` (URLs, comma-separated), `ca`, `token` or `token_file` (an orchestrator
token: it may create any tenant's ports and bind them), `subnet_id`, `security_group_ids`, `host` (this
hypervisor's name in Tianji), and optionally `bridge`, `ovs_rundir`, `netns` (an emulated hypervisor's),
`wait_up_s`, `state_dir`. Errors are CNI error objects: 4 bad configuration, 7 bad environment, 11 try again,
50 not available, 100 the controller refused, 101 plumbing failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tianji_cni.plumbing import Host, PlumbingError, check, plug, unplug

SUPPORTED = ["0.4.0", "1.0.0", "1.1.0"]
TAG = "cni:{container}/{ifname}"  # finds a container's port again (ADD retried, DEL, CHECK)
NETWORK_TAG = "cni-net:{network}"  # this network's ports (GC)


class CniError(Exception):
    def __init__(self, code: int, msg: str, details: str = "", status: int = 0) -> None:
        super().__init__(msg)
        self.code, self.msg, self.details, self.status = code, msg, details, status  # status: the controller's


def _env(name: str, required: bool = True) -> str:
    v = os.environ.get(name, "")
    if required and not v:
        raise CniError(7, f"{name} is not set", "the runtime sets CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, "
                                                "CNI_IFNAME and CNI_PATH")
    return v


class Plugin:
    def __init__(self, conf: dict) -> None:
        self.conf = conf
        for key in ("controller", "subnet_id", "host"):
            if not conf.get(key):
                raise CniError(4, f"the network configuration has no `{key}`")
        token = conf.get("token") or (Path(conf["token_file"]).read_text().strip() if conf.get("token_file") else "")
        if not token:
            raise CniError(4, "the network configuration has no `token` (or `token_file`): an orchestrator token "
                              "(POST /v1/orchestrator-tokens)")
        from tianji.api_client import Client
        from tianji.tls import ClientTls

        self.api = Client(conf["controller"], token, timeout=float(conf.get("timeout_s", 10)),
                          tls=ClientTls(ca=conf.get("ca")))
        self.host = Host(conf.get("bridge", "br-int"), conf.get("ovs_rundir", "/var/run/openvswitch"),
                         conf.get("netns"))
        self.state = Path(conf.get("state_dir", "/var/lib/tianji-cni")) / conf.get("name", "tianji")

    # --- the controller --------------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        from tianji.api_client import ApiFailure

        try:
            return self.api.get(path, **params) if method == "GET" else self.api.request(method, path, body)
        except ApiFailure as e:
            if e.status == 0:
                raise CniError(11, f"the controller is unreachable: {e}") from None
            raise CniError(100, f"the controller refused {method} {path}: HTTP {e.status} {e.detail}",
                           json.dumps(e.body or {}), e.status) from None

    def find_port(self, container: str, ifname: str) -> dict | None:
        tag = TAG.format(container=container[:40], ifname=ifname)
        ports = self.call("GET", "/v1/ports", subnet_id=self.conf["subnet_id"], tag=tag)
        return ports[0] if ports else None

    # --- local records: what DEL needs when the controller does not answer -------------------------------------
    def record(self, container: str, ifname: str) -> Path:
        return self.state / f"{container[:40]}-{ifname}.json"

    def pending(self) -> Path:
        return self.state / "pending-deletes"

    def retry_pending(self) -> list[str]:
        """Port deletions a DEL could not make (the controller was unreachable): made now if it answers."""
        left, done = [], []
        if not self.pending().exists():
            return done
        for pid in self.pending().read_text().split():
            try:
                self.call("DELETE", f"/v1/ports/{pid}")
                done.append(pid)
            except CniError as e:
                if e.status == 404:
                    done.append(pid)
                else:
                    left.append(pid)
        self.pending().write_text("".join(f"{p}\n" for p in left))
        return done

    # --- the commands ----------------------------------------------------------------------------------------
    def add(self) -> dict:
        container, netns, ifname = _env("CNI_CONTAINERID"), _env("CNI_NETNS"), _env("CNI_IFNAME")
        self.retry_pending()
        port = self.find_port(container, ifname)
        if port is None:
            body = {"subnet_id": self.conf["subnet_id"], "name": f"{self.conf.get('name', 'cni')}-{container[:12]}",
                    "host": self.conf["host"], "description": f"container {container} {ifname}"[:255],
                    "tags": [TAG.format(container=container[:40], ifname=ifname),
                             NETWORK_TAG.format(network=self.conf.get("name", "tianji"))[:64]]}
            if self.conf.get("security_group_ids"):
                body["security_group_ids"] = self.conf["security_group_ids"]
            port = self.call("POST", "/v1/ports", body)
        elif port.get("host") != self.conf["host"]:  # adopted after the container moved here
            port = self.call("PATCH", f"/v1/ports/{port['id']}", {"host": self.conf["host"]})
        subnet = self.call("GET", f"/v1/subnets/{port['subnet_id']}")
        vpc = self.call("GET", f"/v1/vpcs/{port['vpc_id']}")
        prefixlen = int(subnet["cidr"].split("/")[1])
        routes = [("0.0.0.0/0", subnet["gateway_ip"])]
        self.state.mkdir(parents=True, exist_ok=True)
        self.record(container, ifname).write_text(json.dumps({"port_id": port["id"], "netns": netns}))
        try:
            plug(self.host, netns, ifname, port, prefixlen, subnet["gateway_ip"], int(vpc["mtu"]), routes)
        except PlumbingError as e:
            raise CniError(101, f"could not plug the container's interface: {e}") from None
        self.wait_up(port["id"])
        return {"interfaces": [{"name": ifname, "mac": port["mac"], "sandbox": netns, "mtu": int(vpc["mtu"])}],
                "ips": [{"address": f"{port['ip']}/{prefixlen}", "gateway": subnet["gateway_ip"], "interface": 0}],
                "routes": [{"dst": d, "gw": g} for d, g in routes],
                "dns": {"nameservers": [subnet["gateway_ip"]]}}

    def wait_up(self, port_id: str) -> None:
        """Until this host's agent reports the port UP (it has the interface and its flows): the container's first
        packet is then forwarded, not lost."""
        deadline = time.monotonic() + float(self.conf.get("wait_up_s", 30))
        while (status := self.call("GET", f"/v1/ports/{port_id}").get("status")) != "UP":
            if time.monotonic() > deadline:
                raise CniError(11, f"port {port_id} is plugged but its host {self.conf['host']} has not reported it "
                                   f"UP (status {status}): is the host's agent running?")
            time.sleep(0.1)

    def delete(self) -> dict | None:
        container, ifname = _env("CNI_CONTAINERID"), _env("CNI_IFNAME")
        rec = self.record(container, ifname)
        port_id = json.loads(rec.read_text())["port_id"] if rec.exists() else None
        try:
            self.retry_pending()
            if port_id is None and (port := self.find_port(container, ifname)) is not None:
                port_id = port["id"]
            if port_id is not None:
                unplug(self.host, port_id)
                self.call("DELETE", f"/v1/ports/{port_id}")
        except CniError as e:
            if e.status == 404:  # deleted already: DEL twice
                pass
            elif port_id is not None:  # unreachable: the local side goes now, the port when the controller answers
                unplug(self.host, port_id)
                self.state.mkdir(parents=True, exist_ok=True)
                with self.pending().open("a") as f:
                    f.write(f"{port_id}\n")
                print(f"tianji-cni: {e.msg}; port {port_id} unplugged here, its deletion kept in {self.pending()} "
                      "and retried by the next ADD, DEL or GC", file=sys.stderr)
            else:
                print(f"tianji-cni: {e.msg}; no local record of {container} {ifname}: nothing to remove here",
                      file=sys.stderr)
        rec.unlink(missing_ok=True)
        return None

    def check(self) -> dict | None:
        container, netns, ifname = _env("CNI_CONTAINERID"), _env("CNI_NETNS"), _env("CNI_IFNAME")
        port = self.find_port(container, ifname)
        if port is None:
            raise CniError(100, f"no port of container {container} {ifname} in subnet {self.conf['subnet_id']}")
        if port.get("host") != self.conf["host"]:
            raise CniError(100, f"port {port['id']} is bound to {port.get('host')}, not {self.conf['host']}")
        subnet = self.call("GET", f"/v1/subnets/{port['subnet_id']}")
        if wrong := check(self.host, netns, ifname, port, int(subnet["cidr"].split("/")[1])):
            raise CniError(101, "; ".join(wrong))
        return None

    def gc(self) -> dict | None:
        """CNI 1.1 GC: this network's ports on this host whose attachment the runtime no longer lists."""
        self.retry_pending()
        valid = {TAG.format(container=a["containerID"][:40], ifname=a["ifname"])
                 for a in self.conf.get("cni.dev/valid-attachments", [])}
        tag = NETWORK_TAG.format(network=self.conf.get("name", "tianji"))[:64]
        for port in self.call("GET", "/v1/ports", host=self.conf["host"], tag=tag):
            if not valid & set(port.get("tags", [])):
                unplug(self.host, port["id"])
                self.call("DELETE", f"/v1/ports/{port['id']}")
        return None

    def status(self) -> dict | None:
        try:
            self.call("GET", f"/v1/subnets/{self.conf['subnet_id']}")
        except CniError as e:
            raise CniError(50, f"tianji-cni cannot add containers now: {e.msg}") from None
        self.retry_pending()
        return None


def main() -> None:
    version = "1.0.0"
    try:
        command = _env("CNI_COMMAND")
        if command == "VERSION":
            print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED}))
            return
        try:
            conf = json.loads(sys.stdin.read() or "{}")
        except ValueError as e:
            raise CniError(6, f"the network configuration is not JSON: {e}") from None
        version = conf.get("cniVersion", version)
        if version not in SUPPORTED:
            raise CniError(1, f"cniVersion {version} is not supported", f"supported: {', '.join(SUPPORTED)}")
        plugin = Plugin(conf)
        handler = {"ADD": plugin.add, "DEL": plugin.delete, "CHECK": plugin.check, "GC": plugin.gc,
                   "STATUS": plugin.status}.get(command)
        if handler is None:
            raise CniError(4, f"CNI_COMMAND {command!r} is not one of ADD, DEL, CHECK, GC, STATUS, VERSION")
        result = handler()
        if result is not None:
            print(json.dumps({"cniVersion": version, **result}))
    except CniError as e:
        print(json.dumps({"cniVersion": version, "code": e.code, "msg": e.msg, "details": e.details}))
        sys.exit(1)
    except Exception as e:  # never a traceback in the runtime's log: an error object with what happened
        print(json.dumps({"cniVersion": version, "code": 999, "msg": f"tianji-cni failed: {e!r}"}))
        sys.exit(1)


if __name__ == "__main__":
    main()
