"""What `tianji login` saved (the controller's URL, a token, the CA), and API refusals as the CLI holds them: what
every command reads before it knows whether it will speak HTTP at all (so `--help` imports no HTTP client)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CONFIG_FILE = Path(os.environ.get("TIANJI_CLI_CONFIG", Path.home() / ".config" / "tianji" / "cli.json"))


class ApiFailure(Exception):
    def __init__(self, status: int, detail: str, field: str | None = None, body: Any = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail, self.field, self.body = status, detail, field, body


def load_cli_config() -> dict:
    try:
        return json.loads(CONFIG_FILE.read_text())
    except (OSError, ValueError):
        return {}
