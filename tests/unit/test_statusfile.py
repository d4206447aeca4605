"""Status files are replaced whole, even when several threads write the same one at once (an agent's reconcile
loop and its heartbeat do)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from tianji.statusfile import write_atomic


def test_threads_writing_one_status_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "agents" / "agent-hv1.json"
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(300):
                write_atomic(path, json.dumps({"writer": k, "i": i, "pad": "x" * 2000}))
        except BaseException as e:  # collected for the assertion
            errors.append(e)

    def reader() -> None:
        for _ in range(600):
            if path.exists():
                json.loads(path.read_text())  # never half a file

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert json.loads(path.read_text())["i"] == 299
    assert [p.name for p in path.parent.iterdir()] == ["agent-hv1.json"]  # no temporary file left behind
