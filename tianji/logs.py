"""Logs for every component: plain text for a terminal, or one JSON object per line for a log pipeline
(`--log-format json`, TIANJI_LOG_FORMAT), with what a record carries in `extra` (request id, credential,
latency...) as fields of its own."""

from __future__ import annotations

import json
import logging
import os
import sys

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        out |= {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


JsonFormatter.converter = __import__("time").gmtime  # timestamps in UTC, as the Z says


def setup(level: str = "info", fmt: str | None = None, component: str | None = None) -> None:
    """The root logger: `fmt` json or text (default: TIANJI_LOG_FORMAT, else text); `component` (a host's name)
    in every line, as a field in JSON."""
    fmt = (fmt or os.environ.get("TIANJI_LOG_FORMAT") or "text").lower()
    if fmt not in ("json", "text"):
        raise ValueError(f"log format {fmt!r}: json or text")
    handler = logging.StreamHandler(sys.stderr)
    text = TEXT_FORMAT if component is None else TEXT_FORMAT.replace(" %(levelname)s", f" {component} %(levelname)s")
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(text))
    if component is not None and fmt == "json":
        handler.addFilter(_Tag(component))
    handler.tianji = True  # type: ignore[attr-defined]  # ours: a second setup replaces it, and only it
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not getattr(h, "tianji", False)] + [handler]
    root.setLevel(level.upper())


class _Tag(logging.Filter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def filter(self, record: logging.LogRecord) -> bool:
        record.component = self.component
        return True
