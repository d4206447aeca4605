"""podman containers in the emulated cluster's VPCs, through tianji-cni, as on a real host: a VPC network is a CNI
conflist naming the controller, an orchestrator token, the subnet and this hypervisor; `podman run --network NAME`
then calls the plugin's ADD, `podman rm` its DEL.

podman itself runs in the machine's root namespace (the emulation has one podman); the conflist's `netns` and
`ovs_rundir` put the container's host end on the emulated hypervisor's bridge, which a real host does not need.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from topologies.podman_setup import IMAGE, NETWORK_DIR, podman

if TYPE_CHECKING:
    from topologies.cluster import Cluster


def conflist(c: Cluster, network: str, subnet_id: str, host: str, security_group_ids: list[str] | None = None
             ) -> dict:
    st = c.state
    hv = st.hypervisors[host]
    plugin = {"type": "tianji-cni", "controller": st.controller_url, "ca": st.ca, "token": st.orchestrator_token,
              "subnet_id": subnet_id, "host": host, "netns": hv["ns"], "ovs_rundir": hv["rundir"],
              "state_dir": str(Path(st.dir) / "cni")}
    if security_group_ids:
        plugin["security_group_ids"] = security_group_ids
    return {"cniVersion": "1.0.0", "name": network, "plugins": [plugin]}


def network_add(c: Cluster, name: str, subnet_id: str, host: str, security_group_ids: list[str] | None = None
                ) -> str:
    """A podman network (its conflist) for a subnet on one hypervisor: `<cluster>-<name>`, removed at `down`."""
    network = f"{c.state.name}-{name}"
    NETWORK_DIR.mkdir(parents=True, exist_ok=True)
    (NETWORK_DIR / f"{network}.conflist").write_text(
        json.dumps(conflist(c, network, subnet_id, host, security_group_ids), indent=1))
    return network


def container_add(c: Cluster, network: str, name: str, host: str) -> dict:
    """`podman run -d --network NETWORK` of the busybox image; its address from the plugin's result."""
    st = c.state
    cname = f"{st.name}-{name}"
    st.vms[name] = {"name": name, "kind": "container", "container": cname, "host": host, "network": network,
                    "ns": "", "ip": "", "prefixlen": ""}
    st.save()
    podman("run", "-d", "--name", cname, "--network", network, IMAGE, "sleep", "86400")
    inspect = json.loads(podman("inspect", cname).stdout)[0]
    net = inspect["NetworkSettings"]["Networks"][network]
    info = st.vms[name] | {"ip": net["IPAddress"], "prefixlen": net["IPPrefixLen"], "mac": net["MacAddress"],
                           "ns": inspect["NetworkSettings"].get("SandboxKey", "")}
    st.vms[name] = info
    st.save()
    return info


def container_exec(c: Cluster, name: str, cmd: tuple[str, ...], timeout: float = 30) -> subprocess.CompletedProcess:
    r = podman("exec", c.state.vms[name]["container"], *cmd, check=False, timeout=timeout)
    return subprocess.CompletedProcess(list(cmd), r.returncode, r.stdout, r.stderr)


def container_remove(c: Cluster, name: str) -> None:
    podman("rm", "-f", "-t", "0", c.state.vms[name]["container"], check=False)


def remove_all(c: Cluster) -> None:
    """Every container and network of this cluster (at `down`: before the controller stops, so DEL deletes the
    ports)."""
    for name, v in list(c.state.vms.items()):
        if v.get("kind") == "container":
            container_remove(c, name)
    for f in NETWORK_DIR.glob(f"{c.state.name}-*.conflist"):
        f.unlink()


__all__ = ["conflist", "container_add", "container_exec", "container_remove", "network_add", "remove_all"]
