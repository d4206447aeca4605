"""What `tianji login` saved (the controller's URL, a token, the CA): what every command reads before it knows
whether it will speak HTTP at all (so `--help` imports no HTTP client)."""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFIG_FILE = Path(os.environ.get("TIANJI_CLI_CONFIG", Path.home() / ".config" / "tianji" / "cli.json"))


def load_cli_config() -> dict:
    try:
        return json.loads(CONFIG_FILE.read_text())
    except (OSError, ValueError):
        return {}


def credentials(url: str | None, token: str | None, ca: str | None) -> tuple[str | None, str | None, str | None,
                                                                             Path | None]:
    """The controller, token and CA a command uses: as given (options or their environment variables), else
    `tianji login`'s; with no token at all and TIANJI_STATE_DIR exported, that controller's admin token, whose
    path comes fourth (the command says it acts as the admin)."""
    cfg = load_cli_config()
    token, admin = token or cfg.get("token"), None
    if not token and os.environ.get("TIANJI_STATE_DIR"):
        state = Path(os.environ["TIANJI_STATE_DIR"]) / "admin.token"
        if state.exists():
            token, admin = state.read_text().strip(), state
    return url or cfg.get("url"), token, ca or cfg.get("ca"), admin
