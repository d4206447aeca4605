"""podman on this machine, for containers in tenant VPCs through tianji-cni: its configuration (`CONTAINERS_CONF`)
and a container image made from Debian's busybox-static (no registry is reached).

What this machine needs and a host with systemd does not: `runc` (Debian's podman may come without crun),
cgroupfs and a file event log (no systemd), and resource limits no higher than this process's own hard limits
(runc sets them in the container and root here lacks CAP_SYS_RESOURCE to raise them: without `default_ulimits`
the container's start fails with "error setting rlimit type 7: operation not permitted").
"""

from __future__ import annotations

import io
import resource
import subprocess
import tarfile
import tempfile
from pathlib import Path

from topologies.guest_image import FETCH, GUEST_CACHE, build

CONF_DIR = Path("/etc/tianji")
CONTAINERS_CONF = CONF_DIR / "containers.conf"
NETWORK_DIR = CONF_DIR / "cni" / "net.d"  # the conflists of the VPC networks podman offers (`--network NAME`)
IMAGE = "localhost/tianji-busybox:3"  # a new tag when what the image holds changes
NPROC_CAP = 32768  # runc refused this machine's hard nproc limit itself; this much is plenty for tests


def conf_text() -> str:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], NPROC_CAP)
    return f"""# written by `make setup` (topologies/podman_setup.py); use with CONTAINERS_CONF={CONTAINERS_CONF}
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "cni"
cni_plugin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]
network_config_dir = "{NETWORK_DIR}"
"""


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       env={"CONTAINERS_CONF": str(CONTAINERS_CONF), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if check and r.returncode:
        raise RuntimeError(f"podman {' '.join(args)}: {r.stderr.strip()}")
    return r


def image() -> None:
    """The busybox image, imported once (a tarball of busybox-static and its applet links)."""
    if podman("image", "exists", IMAGE, check=False).returncode == 0:
        return
    busybox = GUEST_CACHE / "busybox"
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar, "w") as t:
            t.add(busybox, "bin/busybox")
            fetch = tarfile.TarInfo("bin/fetch")  # busybox-static's wget crashes (guest_image.FETCH)
            fetch.size, fetch.mode = len(FETCH.encode()), 0o755
            t.addfile(fetch, io.BytesIO(FETCH.encode()))
            for a in applets:
                if a != "busybox":
                    link = tarfile.TarInfo(f"bin/{a}")
                    link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                    t.addfile(link)
            for d in ("tmp", "etc", "proc", "sys", "dev", "run"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
                t.addfile(info)
        podman("import", "--change", "CMD=/bin/sh", str(tar), IMAGE)


def setup() -> None:
    build()
    NETWORK_DIR.mkdir(parents=True, exist_ok=True)
    if not CONTAINERS_CONF.exists() or CONTAINERS_CONF.read_text() != conf_text():
        CONTAINERS_CONF.write_text(conf_text())
    image()
    r = podman("run", "--rm", "--network", "none", IMAGE, "/bin/echo", "ok", check=False)
    if r.returncode or r.stdout.strip() != "ok":
        raise SystemExit(f"podman cannot run a container here: {r.stderr.strip()}")
    print(f"==> podman: {CONTAINERS_CONF}, image {IMAGE}, VPC networks in {NETWORK_DIR}")


if __name__ == "__main__":
    setup()
