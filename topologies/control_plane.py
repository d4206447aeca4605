"""The emulated cluster's control plane: its CA and certificates, the controller replicas (started, killed and
restarted by index), and API clients of them. Mixed into `topologies.cluster.Cluster`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from tianji.api_client import ApiFailure, Client
from tianji.pki import Authority
from tianji.tls import ClientTls
from topologies.cluster_state import State
from topologies.wiring import underlay_mtu

TIANJI = str(Path(sys.executable).parent / "tianji")
CONTROLLER_MGMT_IP = "169.254.250.1"  # where the controllers listen for the cluster's hosts (MGMT_NET's first)
GATEWAY_KEYS = ("gateways", "lb_gateways", "line_gateways", "service_gateways")


def controller_env() -> dict[str, str]:
    """NAT instances fail over fast here: after 0.5 s of silence, five of the beats the controller asks for
    (overridable: TIANJI_GATEWAY_DOWN_AFTER, and TIANJI_GATEWAY_BEAT for the gateways' own pace)."""
    return os.environ | {"TIANJI_GATEWAY_DOWN_AFTER": os.environ.get("TIANJI_GATEWAY_DOWN_AFTER", "0.5")}


class ControlPlane:
    state: State

    def agent_status(self, hv: str) -> dict: ...  # the cluster's (topologies.cluster)

    def gateway_status(self, name: str) -> dict: ...

    def _make_certificates(self) -> None:
        """The cluster's CA, the controllers' certificate (for every address hosts and tools reach them at) and one
        per host, named after it (the controller accepts a host's token only with that host's certificate)."""
        st = self.state
        ca = Authority(Path(st.dir) / "pki")
        ca.issue("controller", server_names=["127.0.0.1", "localhost", CONTROLLER_MGMT_IP])
        topo = st.topology
        for n in [*topo["hypervisors"], *(n for k in GATEWAY_KEYS for n in topo.get(k, []))]:
            ca.issue(n)
        st.ca = str(ca.cert_path)
        st.save()

    def release_of(self, name: str) -> str:
        """The `tianji` that process `name` (controller-0, hv1, gw1) runs: this checkout's unless an earlier
        release's was given for it (an upgrade's starting point)."""
        return self.state.releases.get(name) or TIANJI

    def tls_args(self, host: str) -> list[str]:
        """A host's flags for its controller connection: the CA, its certificate and key."""
        pki = Path(self.state.dir) / "pki"
        return ["--ca", self.state.ca, "--cert", str(pki / f"{host}.pem"), "--key", str(pki / f"{host}.key")]

    def urls_from(self, address: str) -> str:
        """Every replica's URL, at `address` (where the controllers listen, as a namespace reaches them)."""
        return ",".join(f"https://{address}:{x['port']}" for x in self.state.controllers)

    def start_controller(self, i: int = 0) -> int:
        """Start replica `i` (again: after kill_controller) on its port and state directory."""
        st = self.state
        rep = st.controllers[i]
        cdir = Path(rep["dir"])
        cdir.mkdir(parents=True, exist_ok=True)
        pki = Path(st.dir) / "pki"
        cmd = [self.release_of(f"controller-{i}"), "controller", "serve", "--host", "0.0.0.0", "--port",
               str(rep["port"]), "--state-dir", str(cdir), "--host-down-after", "6", "--log-level", "warning",
               "--tls-cert", str(pki / "controller.pem"), "--tls-key", str(pki / "controller.key"), "--client-ca",
               st.ca]
        env = controller_env() | {"TIANJI_UNDERLAY_MTU": str(underlay_mtu(st.topology))} | {
            f"TIANJI_{k.upper()}": st.topology[k] for k in ("service_network", "service_source_pool")
            if k in st.topology}
        if st.database_url:
            cmd += ["--database-url", st.database_url]
        log_name = "controller.log" if i == 0 else f"controller-{i}.log"
        with open(Path(st.dir) / log_name, "ab") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        rep["pid"] = p.pid
        st.pids.append(p.pid)
        st.save()
        return p.pid

    def kill_controller(self, i: int = 0, sig: int = signal.SIGKILL) -> None:
        """Kill replica `i` (kill -9 by default) and wait until it is gone."""
        stop_group(self.state.controllers[i]["pid"], sig)

    def replica(self, i: int, token: str, timeout: float = 5.0) -> Client:
        """A client of replica `i` alone (no failover to the others)."""
        url = self.state.controller_url.split(",")[i]
        return Client(url, token, timeout=timeout, tls=ClientTls(ca=self.state.ca))

    def replica_health(self, i: int, path: str = "/healthz") -> dict | None:
        """Replica `i`'s /healthz as the admin sees it (its role), or /readyz; None when it does not answer."""
        try:
            return self.replica(i, self.state.admin_token, timeout=1.0).get(path)
        except ApiFailure:
            return None

    def leader(self) -> int | None:
        """The replica that leads (runs the cluster's liveness checks), by index."""
        roles = [(self.replica_health(i) or {}).get("role") for i in range(len(self.state.controllers))]
        leaders = [i for i, r in enumerate(roles) if r == "leader"]
        assert len(leaders) <= 1, f"two replicas lead at once: {roles}"
        return leaders[0] if leaders else None

    def watching(self) -> dict[str, int | None]:
        """Which replica (by index) each agent and gateway instance says it uses."""
        ports = [c["port"] for c in self.state.controllers]
        gws = [n for n, i in self.state.nodes.items() if i["role"] == "gateway"]
        out: dict[str, int | None] = {}
        for name, st in [*((h, self.agent_status(h)) for h in self.state.hypervisors),
                         *((g, self.gateway_status(g)) for g in gws)]:
            port = urlsplit(st.get("controller") or "").port
            out[name] = ports.index(port) if port in ports else None
        return out

    def client(self, token: str) -> Client:
        """An API client of this cluster's controllers (every replica, verified against the cluster's CA)."""
        return Client(self.state.controller_url, token, tls=ClientTls(ca=self.state.ca))

    def _issue_credentials(self) -> None:
        """The admin's token, an orchestrator's, and one per host bound to it (hypervisor or gateway)."""
        st = self.state
        admin = self._admin(wait=True)
        st.admin_token = admin.token
        st.orchestrator_token = admin.post("/v1/orchestrator-tokens", {"name": "orchestrator"})["token"]
        for hv_name in st.hypervisors:
            st.host_tokens[hv_name] = admin.post("/v1/host-tokens", {"host": hv_name})["token"]
        for n, i in st.nodes.items():
            if i["role"] == "gateway":
                st.host_tokens[n] = admin.post("/v1/host-tokens", {"host": n, "kind": "gateway",
                                                                   "role": i.get("gateway_role", "nat")})["token"]
        st.save()

    def _admin(self, wait: bool = False) -> Client:
        token_file = Path(self.state.dir) / "controller" / "admin.token"
        deadline = time.time() + 20
        while True:
            try:
                c = self.client(token_file.read_text().strip())
                c.get("/healthz")
                return c
            except (OSError, ApiFailure):
                if not wait or time.time() > deadline:
                    raise SystemExit("the cluster's controller is not answering; see "
                                     f"{self.state.dir}/controller.log") from None
                time.sleep(0.1)

    @property
    def admin(self) -> Client:
        return self.client(self.state.admin_token)

    @property
    def orchestrator(self) -> Client:
        """Binds ports to hypervisors (`PATCH /v1/ports/{id} {"host": ...}`), as Nova or a CNI plugin would."""
        return self.client(self.state.orchestrator_token)

    def restart_controller(self, down_for: float = 1.0, i: int = 0) -> None:
        """Stop controller replica `i` and start it again on the same port and state."""
        self.kill_controller(i, signal.SIGTERM)
        time.sleep(down_for)
        self.start_controller(i)
        self._admin(wait=True)



def stop_group(pid: int, sig: int) -> None:
    """Signal the process group `pid` leads and wait until its leader is gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    while alive(pid):
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True
