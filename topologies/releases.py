"""Earlier releases of Tianji, each installed once in its own virtualenv from this repository's history, for the
rolling-upgrade scenario (tests/upgrade, `make upgrade-test`): the cluster starts on one, then moves process by
process to this checkout's (docs/operations.md, Upgrades).

    python -m topologies.releases [COMMIT]     # install (cached), print its `tianji`
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# The release an upgrade starts from: main before dual-stack VPCs (#48) and day 2 (#50), with southbound 1.2 and
# schema 0023, so the upgrade migrates the schema and moves the southbound minor version.
PREVIOUS = "9cc7824"
CACHE = Path("/var/cache/tianji/releases")
REPO = Path(__file__).resolve().parents[1]
READY = ".release-ready"  # written last: a directory without it is a build that did not finish


def full_commit(commit: str) -> str:
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"release {commit} is not in {REPO}'s history ({r.stderr.strip()}): the upgrade scenario "
                         "needs a full clone (git fetch --unshallow)")
    return r.stdout.strip()


def install(commit: str = PREVIOUS, progress: Callable[[str], None] = print) -> str:
    """The `tianji` of release `commit`, built on first use into CACHE/<commit> (its source from `git archive`,
    its own venv and native gateway code, by that release's own Makefile), reused afterwards."""
    sha = full_commit(commit)
    home = CACHE / sha[:12]
    tianji = home / ".venv" / "bin" / "tianji"
    if (home / READY).exists() and tianji.exists():
        return str(tianji)
    progress(f"installing release {sha[:12]} into {home} (once; about a minute) ...")
    shutil.rmtree(home, ignore_errors=True)  # a build that did not finish
    home.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(home)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise SystemExit(f"git archive {sha} failed")
    r = subprocess.run(["make", "-C", str(home), "venv", "native"], capture_output=True, text=True)
    if r.returncode or not tianji.exists():
        raise SystemExit(f"building release {sha[:12]} failed (make venv native in {home}):\n{r.stdout[-2000:]}"
                         f"{r.stderr[-2000:]}")
    (home / READY).write_text(sha + "\n")
    progress(f"release {sha[:12]} installed: {tianji}")
    return str(tianji)


if __name__ == "__main__":
    print(install(sys.argv[1] if len(sys.argv) > 1 else PREVIOUS, progress=lambda m: print(m, file=sys.stderr)))
