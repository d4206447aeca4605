"""The southbound schema's version: a config recorded before it carried one (1.0) still programs the same flows;
a newer minor version (fields this code does not know) is read as it is; a newer major version is refused before
anything is applied, with a message that says what to do, and the watch keeps what it holds."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.unit.test_southbound_client import server
from tianji import southbound_client
from tianji.southbound import GatewayConfigDelta, HostConfig, HostConfigDelta
from tianji.southbound_client import Southbound
from tianji.wire import SCHEMA_VERSION
from vswitch_agent.flows import compute_flows

RECORDED = Path(__file__).parents[1] / "data" / "host-config-1.0.json"  # hv1's config, recorded at schema 1.0


def flows_of(cfg: HostConfig) -> set:
    ofports = {p.id: 10 + i for i, p in enumerate(cfg.ports)}
    zones = {v.id: 1 + i for i, v in enumerate(cfg.vpcs)}
    return {(f.cookie, f.table, f.priority) for f in compute_flows(cfg, ofports, 100, zones)}


def test_a_config_recorded_at_the_previous_version_programs_what_it_did() -> None:
    raw = json.loads(RECORDED.read_text())
    assert "schema_version" not in raw and len(raw["ports"]) == 2
    old = HostConfig.model_validate(raw)
    now = HostConfig.model_validate_json(old.model_dump_json())
    assert now.schema_version == SCHEMA_VERSION
    assert flows_of(old) and flows_of(old) == flows_of(now)


def test_a_newer_minor_version_is_read_and_its_new_fields_ignored() -> None:
    raw = json.loads(RECORDED.read_text())
    newer = raw | {"schema_version": "1.99", "a_field_from_the_future": {"x": 1}}
    assert flows_of(HostConfig.model_validate(newer)) == flows_of(HostConfig.model_validate(raw))


@pytest.mark.parametrize("model", [HostConfig, HostConfigDelta, GatewayConfigDelta])
def test_a_newer_major_version_is_refused_saying_what_to_do(model) -> None:
    with pytest.raises(ValidationError) as e:
        model.model_validate({"schema_version": "2.0", "host": "hv1", "name": "gw1", "revision": 9, "base": 1})
    assert "schema 2.0" in str(e.value) and "upgrade" in str(e.value)


def test_the_watch_applies_nothing_of_a_newer_major_version_and_keeps_its_revision(monkeypatch) -> None:
    monkeypatch.setattr(southbound_client, "RETRY_S", 0.01)
    stop, errors, applied = threading.Event(), [], []
    answers = iter([b'{"schema_version": "2.0", "host": "hv1", "revision": 12, "base": 7}'] * 2)

    def answer(_path: str) -> tuple:
        try:
            return 200, next(answers), {}
        except StopIteration:
            stop.set()
            return 304, b"", {}

    with server(answer) as (url, seen):
        Southbound(url, "t").watch("/v1/hosts/hv1/config/delta", HostConfigDelta, lambda: {"after": 7},
                                   lambda d, _a: applied.append(d), errors.append, stop)
    assert applied == [] and len(errors) == 2 and "upgrade" in str(errors[0])
    assert all("after=7" in p for p, _, _ in seen)  # still asking from what it holds
