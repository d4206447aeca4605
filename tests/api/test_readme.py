"""The README's quick start, run as written: every command block of its "API quick start" section, in order, in
one shell, against a fresh controller (on a free port instead of 8080, the only change)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def quick_start_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## API quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_the_readme_quick_start_runs_as_written(tmp_path: Path) -> None:
    blocks = quick_start_blocks()
    assert len(blocks) >= 2, "the quick start has a curl block and a CLI block"
    port = str(free_port())
    script = "set -euo pipefail\n" + "\n".join(b.replace("8080", port) for b in blocks)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIANJI_")} | {"HOME": str(tmp_path)}
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    out = r.stdout
    assert '"host": "hv1"' in out and '"ip": "10.0.1.2"' in out  # the tenant sees its port bound by the orchestrator
    assert "vm2" in out and "pending" not in out.lower()  # the CLI's port list; a same-tenant peering is active
    assert "vpcs" in out and "unlimited" not in out  # the quota table
    assert "REACHABLE" in out and "10.1.1." in out  # the trace; the port's address (-o value -c ip)
