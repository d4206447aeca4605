"""The config stream (`/v1/hosts/{name}/config/stream`, server-sent events) as the agent's client follows it: every
change arrives as one event on the one connection, applied it equals the whole config; the open stream keeps its
host up without a heartbeat; a write wakes the watches it concerns and no other; a host may stream its own config
only; a client of an older controller (no stream) is told so."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import Controller, backends, served
from tests.support.wait import wait_for
from tianji.host_delta import apply_delta
from tianji.southbound import HostConfig, HostConfigDelta
from tianji.southbound_client import Southbound, SouthboundError


class Follower:
    """A host following its stream on a thread, as vswitch_agent does."""

    def __init__(self, c: Controller, host: str, token: str, keepalive: float = 0.3) -> None:
        self.api = Southbound(c.url, token, tls=c.tls)
        self.keepalive = keepalive
        self.host, self.cfg, self.events, self.bytes = host, None, 0, 0
        self.last: HostConfigDelta | None = None
        self.stop = threading.Event()
        self.result: list[bool] = []
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        self.result.append(self.api.stream(
            f"/v1/hosts/{self.host}/config/stream", HostConfigDelta,
            lambda: {"after": self.cfg.revision if self.cfg else -1}, self.take, self.errors.append, self.stop,
            keepalive=self.keepalive))

    def take(self, d: HostConfigDelta, answer) -> None:
        self.last = d
        self.cfg = apply_delta(self.cfg, d)
        assert self.cfg is not None
        self.events += 1
        self.bytes += len(answer.body)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.api.close()


def _setup(c: Controller, hosts: list[str]) -> tuple[dict[str, str], list[dict]]:
    tokens = {}
    for i, h in enumerate(hosts):
        c.admin.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
        tokens[h] = c.admin.post("/v1/host-tokens", {"host": h})["token"]
    t = c.tenant()
    subnets = []
    for v in range(2):
        vpc = t.post("/v1/vpcs", {"name": f"v{v}", "cidr": f"10.{v}.0.0/16"})
        subnets.append(t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": f"10.{v}.0.0/24"}))
    return tokens, subnets


def test_stream_follows_writes_on_one_connection(controller: Controller) -> None:
    c = controller
    tokens, subnets = _setup(c, ["hv1", "hv2", "hv3"])
    orch = c.orchestrator()
    orch.post("/v1/ports", {"subnet_id": subnets[0]["id"], "name": "a", "host": "hv1"})
    orch.post("/v1/ports", {"subnet_id": subnets[1]["id"], "name": "b", "host": "hv3"})
    f = {h: Follower(c, h, tok) for h, tok in tokens.items()}
    try:
        wait_for(lambda: all(x.cfg is not None for x in f.values()), 10, "every host's first config")
        first = {h: x.events for h, x in f.items()}
        for i in range(5):  # writes to v0, whose only host is hv1 (and hv2 once it gets a port there)
            orch.post("/v1/ports", {"subnet_id": subnets[0]["id"], "name": f"p{i}", "host": "hv1"})
        orch.post("/v1/ports", {"subnet_id": subnets[0]["id"], "name": "q", "host": "hv2"})

        def caught_up() -> bool:
            return all(x.cfg == HostConfig.model_validate(c.admin.get(f"/v1/hosts/{h}/config"))
                       for h, x in f.items())

        wait_for(caught_up, 10, "every host's config, as its stream brought it, equals the whole config")
        assert f["hv3"].events == first["hv3"]  # v1 was not written: hv3's stream heard nothing
        assert f["hv1"].events > first["hv1"] and len(f["hv1"].cfg.endpoints) == 7
        c.admin.post("/v1/hosts", {"name": "joiner", "vtep_ip": "172.31.9.9"})  # the VTEP list: everyone, by entry
        wait_for(lambda: all("joiner" in {v.host for v in x.cfg.vteps} for x in f.values()), 10, "the new VTEP")
        for i in range(5):  # joins interleaved with a write to a VPC: entries alone, then the VPC's section
            c.admin.post("/v1/hosts", {"name": f"more{i}", "vtep_ip": f"172.31.8.{i + 1}"})
            if i == 2:
                orch.post("/v1/ports", {"subnet_id": subnets[1]["id"], "name": "late", "host": "hv3"})
        c.admin.delete("/v1/hosts/more4")
        wait_for(caught_up, 10, "every host's config after the joins and the write")
        assert all(not x.errors for x in f.values()), {h: x.errors for h, x in f.items()}
        assert all(x.api.streaming for x in f.values())
        assert not c.app.state.broadcaster.every  # every subscription is indexed by its host and VPCs
        assert set(c.app.state.broadcaster.by_host) == {"hv1", "hv2", "hv3"}
    finally:
        for x in f.values():
            x.close()
    wait_for(lambda: not c.app.state.broadcaster.subs, 10, "the closed streams' subscriptions gone")


@pytest.mark.parametrize("backend", backends())
def test_an_open_stream_is_the_heartbeat(backend: str, tmp_path: Path) -> None:
    """hv1 streams, asking for no keep-alive line within a minute, and never beats; hv2 neither streams nor
    beats: only hv2 goes down, and hv1 is still up two silences later. hv1's beats are its TCP stack's answers
    to the kernel's probes (controller/southbound/open_streams.py), not lines the controller writes."""
    with served(backend, tmp_path, host_down_after=3.0) as c:
        tokens, _ = _setup(c, ["hv1", "hv2"])
        f = Follower(c, "hv1", tokens["hv1"], keepalive=60)
        try:
            wait_for(lambda: f.cfg is not None, 10, "hv1's first config")
            assert len(c.app.state.open_streams) == 1  # its connection proves it: the kernel probes it
            wait_for(lambda: c.admin.get("/v1/hosts/hv2")["status"] == "down", 15, "hv2 marked down")
            time.sleep(6.5)
            assert c.admin.get("/v1/hosts/hv1")["status"] == "up"
        finally:
            f.api.close()  # its stream waits a minute for a line: closing the client ends it
            f.close()


def test_a_host_streams_its_own_config_only(controller: Controller) -> None:
    tokens, _ = _setup(controller, ["hv1", "hv2"])
    with httpx.Client(base_url=controller.url, headers={"Authorization": f"Bearer {tokens['hv1']}"}) as h:
        r = h.get("/v1/hosts/hv2/config/stream")
        assert r.status_code == 403
        r = h.get("/v1/hosts/hv1/config/stream", params={"keepalive": 0})
        assert r.status_code == 422 and "keepalive" in r.text
    with httpx.Client(base_url=controller.url,
                      headers={"Authorization": f"Bearer {controller.admin_token}"}) as a:
        assert a.get("/v1/hosts/nope/config/stream").status_code == 404


def test_a_controller_without_the_stream_is_told_apart_from_an_unknown_host(controller: Controller) -> None:
    tokens, _ = _setup(controller, ["hv1"])
    api = Southbound(controller.url, controller.admin_token, tls=controller.tls)
    seen: list[Exception] = []
    stop = threading.Event()
    # an unknown host: an error to report (the agent registers again), and the stream is retried
    t = threading.Thread(target=api.stream, args=("/v1/hosts/ghost/config/stream", HostConfigDelta, dict,
                                                   lambda d, a: None, seen.append, stop), daemon=True)
    t.start()
    wait_for(lambda: seen, 5, "the 404's report")
    stop.set()
    t.join(5)
    assert isinstance(seen[0], SouthboundError) and seen[0].status == 404
    # no such route (an older controller): False at once, and the caller long-polls instead
    assert api.stream("/v1/hosts/hv1/config/no-such-stream", HostConfigDelta, dict, lambda d, a: None) is False
    api.close()


@pytest.mark.parametrize("n", [30])
def test_many_streams_one_write_wakes_only_its_watchers(controller: Controller, n: int) -> None:
    c = controller
    hosts = [f"hv{i}" for i in range(n)]
    tokens, subnets = _setup(c, hosts)
    orch = c.orchestrator()
    for i, h in enumerate(hosts):  # hv0..hv9 hold v0, the others v1
        orch.post("/v1/ports", {"subnet_id": subnets[0 if i < 10 else 1]["id"], "name": f"p{i}", "host": h})
    f = {h: Follower(c, h, tokens[h]) for h in hosts}
    try:
        wait_for(lambda: all(x.cfg is not None for x in f.values()), 20, "every host's first config")
        before = {h: x.events for h, x in f.items()}
        hub = c.app.state.stream_hub
        batches, compiled = hub.batches, hub.compiled  # before the write: its streams may compile before it answers
        orch.post("/v1/ports", {"subnet_id": subnets[0]["id"], "name": "new", "host": "hv0"})
        wait_for(lambda: all(f[h].events > before[h] for h in hosts[:10]), 10, "v0's hosts told")
        time.sleep(0.5)
        assert all(f[h].events == before[h] for h in hosts[10:])
        # the ten woken streams compiled together: far fewer batches than streams (controller/southbound/stream_hub.py)
        assert hub.compiled - compiled == 10 and hub.batches - batches <= 5, (hub.batches - batches)
    finally:
        for x in f.values():
            x.close()


def test_a_vpc_sent_before_changes_by_endpoint(controller: Controller) -> None:
    """A port created, moved and deleted in a VPC of 60 ports: every host of the VPC is sent that one endpoint (or
    its removal), and what it holds equals the whole config each time."""
    c = controller
    tokens, subnets = _setup(c, ["hv1", "hv2", "hv3"])
    orch = c.orchestrator()
    orch.post("/v1/ports/bulk", {"ports": [{"subnet_id": subnets[0]["id"], "name": f"p{j}",
                                            "host": f"hv{j % 3 + 1}"} for j in range(60)]})
    f = {h: Follower(c, h, tok) for h, tok in tokens.items()}

    def settled(what: str) -> None:
        wait_for(lambda: all(x.cfg == HostConfig.model_validate(c.admin.get(f"/v1/hosts/{h}/config"))
                             for h, x in f.items()), 10, what)

    try:
        settled("the first configs")
        b0 = {h: x.bytes for h, x in f.items()}
        p = orch.post("/v1/ports", {"subnet_id": subnets[0]["id"], "name": "new", "host": "hv1"})
        settled("the new port everywhere")
        for h in ("hv2", "hv3"):  # not their own port: the VPC patched with one endpoint
            d = f[h].last
            assert d.patched_vpcs == [subnets[0]["vpc_id"]] and [e.port_id for e in d.endpoints] == [p["id"]]
            assert not d.ports and not d.ports_removed  # its own 20 ports there did not change: not sent
            # the VPC's entry, and its default group, whose members (an address per port) did change: 2.3 KB,
            # against 20 KB for the VPC's whole section
            assert f[h].bytes - b0[h] < 3000, str({k: len(str(v)) for k, v in d.model_dump().items()})
        orch.patch(f"/v1/ports/{p['id']}", {"host": "hv2"})
        settled("the moved port everywhere")
        assert [e.host for e in f["hv3"].last.endpoints] == ["hv2"]
        c.admin.delete(f"/v1/ports/{p['id']}")
        settled("the deleted port gone everywhere")
        assert f["hv3"].last.endpoints_removed == [p["id"]] and not f["hv3"].last.endpoints
    finally:
        for x in f.values():
            x.close()


@pytest.mark.parametrize("backend", backends())
def test_a_streaming_host_held_down_is_asked_to_report(backend: str, tmp_path: Path) -> None:
    """A host the controller holds down while its stream is open (marked down while a stall kept its beats from
    being written) only comes back up with a report: the controller asks for it on the stream, and the agent,
    which reports when asked (and on every new stream), reports."""
    from controller.state import models as m

    with served(backend, tmp_path, host_down_after=2.0) as c:
        tokens, _ = _setup(c, ["hv1"])
        f = Follower(c, "hv1", tokens["hv1"], keepalive=1)
        try:
            wait_for(lambda: f.cfg is not None and f.api.report_wanted == 1, 10, "hv1 streaming (a report wanted)")
            with c.db.write() as t:  # as a leader that misjudged it would
                t.session.get(m.Host, "hv1").status = "down"
            wait_for(lambda: f.api.report_wanted >= 2, 15, "hv1 asked for its report")
            assert f.api.beat("hv1", {"ports": {}})["updated_ports"] == 0  # the agent's report
            assert c.admin.get("/v1/hosts/hv1")["status"] == "up"
            time.sleep(0.5)  # a round that read it down just before the report may still ask once more
            wanted = f.api.report_wanted
            time.sleep(4.5)  # two rounds of the check later: an up host is not asked
            assert f.api.report_wanted == wanted and f.errors == [], f.errors
            assert f.cfg is not None and c.app.state.broadcaster.by_host.keys() == {"hv1"}  # on its first stream
        finally:
            f.close()


def test_a_mass_join_reaches_each_stream_in_a_few_events(controller: Controller) -> None:
    """Hosts joining in a mass (a cluster booting) reach every stream, each taking the new VTEP entries together
    about once a second (host_stream.JOIN_COALESCE_S) instead of one event per host: a thousand agents booting
    were a million events."""
    c = controller
    tokens, _ = _setup(c, ["hv1", "hv2"])
    f = {h: Follower(c, h, tok, keepalive=5) for h, tok in tokens.items()}
    try:
        wait_for(lambda: all(x.cfg is not None for x in f.values()), 10, "every host's first config")
        before = {h: x.events for h, x in f.items()}
        joiners = {f"boot{i}" for i in range(40)}
        for i, h in enumerate(sorted(joiners)):
            c.admin.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.7.{i + 1}"})
        wait_for(lambda: all(joiners <= {v.host for v in x.cfg.vteps} for x in f.values()), 15, "every joiner")
        events = {h: x.events - before[h] for h, x in f.items()}
        assert all(n < 20 for n in events.values()), events  # one per host would be 40
        assert all(not x.errors for x in f.values()), {h: x.errors for h, x in f.items()}
    finally:
        for x in f.values():
            x.close()


def test_a_slow_compile_keeps_the_stream_alive(controller: Controller) -> None:
    """An overloaded controller is slow, not gone: while a stream's compile waits in a backlog longer than the
    watcher's patience (three keep-alives), keep-alive lines still flow, and the delta comes on the same
    connection. (Without them, every watcher reconnected and queued again behind the same backlog: at 200,000
    ports none was answered any more.)"""
    c = controller
    tokens, subnets = _setup(c, ["hv1"])
    hub = c.app.state.stream_hub
    fast = hub._compile

    def slow(asked):
        time.sleep(1.5)  # five keep-alives of 0.3 s
        return fast(asked)

    hub._compile = slow
    f = Follower(c, "hv1", tokens["hv1"], keepalive=0.3)
    try:
        wait_for(lambda: f.cfg is not None, 10, "the first config through a slow compile")
        c.orchestrator().post("/v1/ports", {"subnet_id": subnets[0]["id"], "name": "a", "host": "hv1"})
        wait_for(lambda: len(f.cfg.endpoints) == 1, 10, "the port through another slow compile")
        assert not f.errors and f.api.report_wanted == 1  # one connection all along
    finally:
        hub._compile = fast
        f.close()
