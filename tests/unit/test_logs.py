"""tianji/logs.py: JSON lines with what a record carries, and a setup that replaces only its own handler."""

from __future__ import annotations

import io
import json
import logging

from tianji import logs


def test_json_lines_and_one_handler_of_ours(monkeypatch) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    level = root.level
    buf = io.StringIO()
    monkeypatch.setattr("sys.stderr", buf)
    try:
        logs.setup("info", "json", component="hv1")
        logs.setup("info", "json", component="hv1")  # again: still one of ours, the others kept
        assert len([h for h in root.handlers if getattr(h, "tianji", False)]) == 1
        assert all(h in root.handlers for h in before)
        lg = logging.getLogger("logs-test")  # its own: another test may have quieted the `tianji` loggers
        lg.setLevel(logging.INFO)
        lg.propagate = True
        lg.info("hello %s", "there", extra={"request_id": "r1", "latency_ms": 1.5})
        line = json.loads(buf.getvalue().strip().splitlines()[-1])
        assert (line["msg"], line["level"], line["logger"]) == ("hello there", "info", "logs-test")
        assert (line["request_id"], line["latency_ms"], line["component"]) == ("r1", 1.5, "hv1")
        assert line["ts"].endswith("Z")
    finally:
        root.handlers[:] = before
        root.setLevel(level)
