"""Status files that other processes read (`tianji agent status`, `tianji gateway status`, the cluster harness)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: a reader sees the old file or the new one, never half of one. The
    temporary file is unique per write, so that threads writing the same status at once do not rename each
    other's (an agent's reconcile loop and heartbeat both write its status: with one shared `.tmp` name, one of
    them failed now and then with 'No such file or directory')."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
