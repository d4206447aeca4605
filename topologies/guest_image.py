"""The KVM guests' image, built from Debian's packages only and cached: a Debian cloud kernel and an initramfs of
busybox-static with the virtio-net modules, whose init gets its address by DHCP from the switch (as any cloud
image's would) and serves a shell on the serial console for the tests.

Nothing is downloaded from anywhere but the machine's Debian archive (`apt-get download`); the result lives in
`GUEST_CACHE` and is rebuilt only when the kernel or busybox package changes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

GUEST_CACHE = Path(os.environ.get("TIANJI_GUEST_CACHE", "/var/cache/tianji/guest"))
KERNEL_META = "linux-image-cloud-amd64"  # its dependency names the kernel: small, with virtio as modules
BUSYBOX = "busybox-static"  # installed it would replace Debian's busybox: only downloaded and unpacked
# virtio-net and what it needs, in dependency order (busybox's insmod does not resolve dependencies)
MODULES = ("drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_pci_modern_dev",
           "drivers/virtio/virtio_pci_legacy_dev", "drivers/virtio/virtio_pci", "net/core/failover",
           "drivers/net/net_failover", "drivers/net/virtio_net")
READY = "TIANJI-GUEST-READY"  # the init prints it on the console once the shell is there
BEGIN, END = "@@TJ-BEGIN@@", "@@TJ-END@@"  # around each console command's output; END carries its exit status

INIT = """#!/bin/sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /tmp /run /var/run /etc; mount -t devpts devpts /dev/pts; mount -t tmpfs tmp /tmp
for m in {modules}; do insmod /lib/modules/$m.ko || echo "tianji-guest: insmod $m failed"; done
for a in $(cat /proc/cmdline); do case $a in tianji.name=*) hostname "${{a#tianji.name=}}";; esac; done
ip link set lo up
# the address, MTU, routes and resolver from the switch's DHCP answer; renewed in the background as a cloud
# image's client does
udhcpc -i eth0 -s /etc/udhcpc.script -O mtu -O staticroutes -O dns -O domain -t 20 -T 1 -b -p /run/udhcpc.pid \
  >/tmp/udhcpc.log 2>&1
stty -F /dev/ttyS0 raw -echo
echo {ready} >/dev/ttyS0
# the console: one command per line, its output between markers (no prompt, no line editing, nothing echoed)
exec sh -c 'while IFS= read -r line; do echo "{begin}"; sh -c "$line" </dev/null 2>&1; echo "{end} $?"; done' \
  </dev/ttyS0 >/dev/ttyS0 2>&1
"""

# busybox's udhcpc hands its answer to a script; this one applies all of it (MTU and classless routes included)
UDHCPC_SCRIPT = """#!/bin/sh
case "$1" in
  deconfig) ip addr flush dev "$interface"; ip link set "$interface" up ;;
  bound|renew)
    [ -n "$mtu" ] && ip link set "$interface" mtu "$mtu"
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" \
      broadcast "${broadcast:-+}" dev "$interface"
    if [ -n "$staticroutes" ]; then
      set -- $staticroutes
      while [ $# -ge 2 ]; do ip route replace "$1" via "$2" dev "$interface"; shift 2; done
    elif [ -n "$router" ]; then
      for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
    fi
    : > /etc/resolv.conf
    [ -n "$domain" ] && echo "search $domain" >> /etc/resolv.conf
    for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
    echo "$ip" > /tmp/dhcp-bound ;;
esac
exit 0
"""


# busybox-static's wget crashes here (its static libc's name service lookups): `fetch URL` is an HTTP/1.0 GET over
# busybox's nc, a host name resolved by busybox's own DNS client (nslookup, through the resolver DHCP gave); the
# body on stdout, exit status 1 without a 2xx answer
FETCH = r"""#!/bin/sh
url="$1"; rest="${url#http://}"; hostport="${rest%%/*}"; host="${hostport%%:*}"; port=80
case "$rest" in */*) path="/${rest#*/}";; *) path="/";; esac
case "$hostport" in *:*) port="${hostport#*:}";; esac
case "$host" in
  *[!0-9.]*) ip=$(nslookup "$host" 2>/dev/null | awk '/^Name:/{f=1} f && /^Address/{print $NF; exit}')
             [ -n "$ip" ] || { echo "fetch: cannot resolve $host" >&2; exit 1; } ;;
  *) ip="$host" ;;
esac
resp=$(printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$host" \
       | nc -w "${FETCH_TIMEOUT:-3}" "$ip" "$port" | tr -d '\r')
[ -n "$resp" ] || { echo "fetch: no answer from $ip:$port" >&2; exit 1; }
printf '%s\n' "$resp" | sed '1,/^$/d'
printf '%s\n' "$resp" | head -1 | grep -q ' 2[0-9][0-9] '
"""


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path
    versions: dict


def _run(*cmd: str, cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def _kernel_package() -> str:
    """The versioned kernel package the meta package depends on now (e.g. linux-image-6.1.0-57-cloud-amd64)."""
    for line in _run("apt-cache", "depends", KERNEL_META).splitlines():
        if line.strip().startswith("Depends:") and "linux-image-" in line:
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"`apt-cache depends {KERNEL_META}` names no kernel: `apt-get update` first")


def _version(package: str) -> str:
    for line in _run("apt-cache", "policy", package).splitlines():
        if line.strip().startswith("Candidate:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"no candidate version of {package}: `apt-get update` first")


def _download(package: str, into: Path) -> Path:
    _run("apt-get", "download", "-q", package, cwd=into)
    debs = sorted(into.glob(f"{package}_*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get download {package} left no .deb in {into}")
    return debs[-1]


def _cpio_newc(files: list[tuple[str, int, bytes]]) -> bytes:
    """An initramfs archive (cpio `newc`, as the kernel reads it): (path, mode, data); a symlink's data is its
    target."""
    out = io.BytesIO()

    def entry(ino: int, name: str, mode: int, data: bytes) -> None:
        nm = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nm), 0))
        out.write(hdr.encode() + nm)
        out.write(b"\0" * (-(110 + len(nm)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))

    for ino, (name, mode, data) in enumerate(files, start=1):
        entry(ino, name, mode, data)
    entry(0, "TRAILER!!!", 0, b"")
    return out.getvalue()


def _initramfs(busybox_path: Path, modules: dict[str, bytes]) -> bytes:
    d, x, r, lnk = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644, stat.S_IFLNK | 0o777
    files: list[tuple[str, int, bytes]] = [(p, d, b"") for p in (
        "bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "run", "var", "var/run",
        "lib", "lib/modules", "root")]
    files.append(("bin/busybox", x, busybox_path.read_bytes()))
    applets = _run(str(busybox_path), "--list-full").split()  # busybox answers to its own name only
    seen = {"bin/busybox"}
    for a in applets:
        if a not in seen:
            seen.add(a)
            depth = a.count("/")
            files.append((a, lnk, ("../" * depth + "bin/busybox").encode()))
    files += [(f"lib/modules/{name}.ko", r, data) for name, data in modules.items()]
    files.append(("init", x, INIT.format(modules=" ".join(modules), ready=READY, begin=BEGIN, end=END).encode()))
    files.append(("etc/udhcpc.script", x, UDHCPC_SCRIPT.encode()))
    files.append(("usr/bin/fetch", x, FETCH.encode()))
    files.append(("etc/hosts", r, b"127.0.0.1 localhost\n"))
    files.append(("etc/resolv.conf", r, b""))
    return gzip.compress(_cpio_newc(files), compresslevel=6)


def build(progress=print, cache: Path = GUEST_CACHE) -> GuestImage:
    """The cached image, built first if absent or if Debian now ships another kernel or busybox."""
    want = {"kernel": _kernel_package(), BUSYBOX: _version(BUSYBOX)}
    want["kernel_version"] = _version(want["kernel"])
    want["recipe"] = hashlib.sha256((INIT + UDHCPC_SCRIPT + FETCH + " ".join(MODULES)).encode()).hexdigest()[:16]
    meta = cache / "image.json"
    if meta.exists() and json.loads(meta.read_text()).get("versions") == want \
            and all((cache / f).exists() for f in ("vmlinuz", "initrd.gz", "busybox")):
        return GuestImage(cache / "vmlinuz", cache / "initrd.gz", want)
    progress(f"building the KVM guest image from Debian packages ({want['kernel']} {want['kernel_version']}, "
             f"{BUSYBOX} {want[BUSYBOX]}) into {cache} ...")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        t = Path(tmp)
        kdeb, bdeb = _download(want["kernel"], t), _download(BUSYBOX, t)
        _run("dpkg-deb", "-x", str(kdeb), str(t / "k"))
        _run("dpkg-deb", "-x", str(bdeb), str(t / "b"))
        vmlinuz = next((t / "k" / "boot").glob("vmlinuz-*"))
        moddir = next((t / "k" / "lib" / "modules").iterdir()) / "kernel"
        modules = {Path(m).name: (moddir / f"{m}.ko").read_bytes() for m in MODULES}
        initrd = _initramfs(t / "b" / "bin" / "busybox", modules)
        shutil.copyfile(t / "b" / "bin" / "busybox", cache / "busybox.new")  # the containers' image has it too
        os.chmod(cache / "busybox.new", 0o755)
        os.replace(cache / "busybox.new", cache / "busybox")
        shutil.copyfile(vmlinuz, cache / "vmlinuz.new")
        (cache / "initrd.gz.new").write_bytes(initrd)
        os.replace(cache / "vmlinuz.new", cache / "vmlinuz")
        os.replace(cache / "initrd.gz.new", cache / "initrd.gz")
    meta.write_text(json.dumps({"versions": want}, indent=1))
    (cache / "accel.json").unlink(missing_ok=True)  # a new kernel is probed again
    progress(f"guest image ready: {cache / 'vmlinuz'} ({(cache / 'vmlinuz').stat().st_size // 1024} KiB), "
             f"{cache / 'initrd.gz'} ({len(initrd) // 1024} KiB)")
    return GuestImage(cache / "vmlinuz", cache / "initrd.gz", want)


if __name__ == "__main__":
    build()
