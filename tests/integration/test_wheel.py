"""A non-editable install can build the gateway's data plane: the wheel carries the C sources, the headers that are
its interface and the Makefile, and `python -m nfv_gateways.build` compiles them where the wheel was installed, then
the libraries load and answer (the NAT stage's constants, read from the library itself)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_builds_and_loads_the_data_plane(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True, text=True, cwd=tmp_path)
    wheel = next(dist.glob("tianji-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("nfv_gateways/native/Makefile", "nfv_gateways/native/include/tj_dp.h",
                   "nfv_gateways/native/include/tj_nat.h", "nfv_gateways/native/nat_stage.c",
                   "controller/state/migrations/versions/0008_snat_eip_rows_token_roles.py"):
        assert needed in names, f"{needed} is not in the wheel"
    assert not [n for n in names if n.endswith(".so")], "a compiled library was shipped"
    # the CNI plugin is in it, with its command (container hosts install the wheel, then link the command into
    # /opt/cni/bin as `make setup` does)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "tianji_cni/main.py" in names and "tianji-cni = tianji_cni.main:main" in entry_points

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    target = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    with zipfile.ZipFile(wheel) as z:  # what pip does for a pure wheel: unpack it into site-packages
        z.extractall(target)
    # the dependencies from this environment's site-packages (PYTHONPATH: no .pth, so not this checkout)
    env = os.environ | {"PYTHONPATH": sysconfig.get_paths()["purelib"]}
    built = subprocess.run([str(py), "-m", "nfv_gateways.build"], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    assert f"{target}/nfv_gateways/native/_gw_packet.so" in built.stdout, built.stdout
    probe = ("import nfv_gateways, nfv_gateways.native.dataplane as d; from nfv_gateways.native.api import constants; "
             "print(nfv_gateways.__file__); print(sorted(constants(d.load('packet')))[:3])")
    got = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(target), got.stdout  # the installed copy, not this checkout
