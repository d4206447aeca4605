"""The one client of the southbound API: what a hypervisor's agent and a gateway instance say to the controller.

`call` is a request (registration, heartbeats, reports); `watch` is the long-poll loop both run: it asks for what
changed after what the caller holds (`params`), hands each answer to `apply` as the caller's delta model, and on
any error (the controller away, an answer that does not parse) says so to `errors`, waits and asks again from
what is still held, never from scratch. One error type, `SouthboundError`, whatever went wrong on the way.
On httpx: kept-alive connections (a new connection per poll cost milliseconds per change), the long-poll on a
client of its own so that a beat never waits behind it.

Replicas: given several controllers (`--controller URL,URL`), a request that cannot reach its controller (refused,
reset, timed out) or gets a 5xx is asked of the next at once, after a jittered pause (a thousand hosts leaving a
dead replica must not land on the next in the same millisecond); the watch then resumes there from what it holds.
`current` is the controller in use, for the caller's status.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tianji.plain_http import PlainClient, PlainHttpError, PlainResponse
from tianji.tls import ClientTls, split_urls

if TYPE_CHECKING:
    import httpx
    from pydantic import BaseModel

log = logging.getLogger(__name__)
M = TypeVar("M", bound="BaseModel")
POLL_S = 25  # how long the controller holds a watch without news
RETRY_S = 1.0  # the longest wait after a poll that reached no controller (it doubles up to this from 0.1 s)
FAILOVER_JITTER_S = 0.2  # the longest pause before asking the next replica
# while its config stream is its beat, a host's unchanged port report is sent again about this often (as
# Kubernetes' kubelet sends its unchanged node status every 5 minutes, its lease being the beat); a report also
# goes with every new stream, and the controller ends the stream of a host it holds down
REPORT_REFRESH_S = 300.0
KEEPALIVE_S = 10.0  # a stream's keep-alive lines: a controller stalled but connected is left after three missed
# A controller that vanished (its machine, the network) is noticed by TCP first: the kernel probes a stream silent
# for 2 s and drops it when nothing was acknowledged for 6 s, without a byte from the controller's process.
# (Its side probes back: controller/southbound/open_streams.py. Keep-alive lines every 2 s were 7% of its core
# at 1,000.)
STREAM_SOCKET_OPTIONS = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2),
                         (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1),
                         (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 6000)]


def next_refresh(now: float) -> float:
    """When an unchanged report is due again: REPORT_REFRESH_S, jittered by a quarter either way, so that the hosts
    a controller restart reconnected together do not all report in the same second (1,000 reports at once were a
    burst of 2.3 s of the controller's CPU every refresh)."""
    return now + REPORT_REFRESH_S * random.uniform(0.75, 1.25)


class SouthboundError(Exception):
    """A request to the controller failed: `status` is its HTTP status, 0 when the controller was not reached."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}" if status else detail)
        self.status, self.detail = status, detail


@dataclass
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]  # case-insensitive, as HTTP header names are (servers send them in any case)


class Southbound:
    def __init__(self, urls: str | list[str], token: str | None, timeout: float = 10.0,
                 tls: ClientTls | None = None, plain: bool = False) -> None:
        """`plain`: requests on the standard library's HTTP (tianji/plain_http.py), for a command's few; streams
        and long-polls stay on httpx."""
        self.plain = plain
        self.urls = split_urls(urls)
        self.url = self.urls[0]  # the controller in use
        self.failovers = 0
        self.on_failover: Callable[[str], None] | None = None  # told the new controller's URL (status files)
        self.events: dict[str, Callable[[str], None]] = {}  # a stream's other events by name: told their data
        self._mover: int | None = None  # the thread whose request moved us last
        self.token = token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        tls = tls or ClientTls.from_env()
        # one context for every connection of this client; none where no URL is TLS (httpx would otherwise load the
        # system's CA store for each of its clients: ~1 MB and milliseconds apiece, a thousand simulated hosts' worth)
        self._verify: ssl.SSLContext | bool = tls.context() if any(u.startswith("https://") for u in self.urls) \
            else False
        self._clients: dict[tuple[str, bool], httpx.Client | PlainClient] = {}
        self._lock = threading.Lock()
        self.streaming = False  # a stream is open and heard from (then it is the host's heartbeat)
        self.heard = 0.0  # when it last was (monotonic)
        # bumped on each new stream and each `report` event: the host's report is wanted again (the controller it
        # reaches may hold nothing of it: restarted, another replica; or it holds the host down)
        self.report_wanted = 0

    @property
    def current(self) -> str:
        return self.url

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return self._verify

    def client(self, url: str, poller: bool = False) -> httpx.Client | PlainClient:
        with self._lock:
            c = self._clients.get((url, poller))
            if c is None and self.plain and not poller:
                c = self._clients[(url, poller)] = PlainClient(url, self._headers, self._verify, self._timeout)
            elif c is None:
                httpx = _httpx()
                c = self._clients[(url, poller)] = httpx.Client(
                    base_url=url, headers=self._headers, verify=self._verify,
                    timeout=POLL_S + 15 if poller else self._timeout,
                    transport=httpx.HTTPTransport(verify=self._verify, socket_options=STREAM_SOCKET_OPTIONS)
                    if poller else None)
            return c

    def send(self, method: str, path: str, *, poller: bool = False, idempotent: bool = True,
             **kw: Any) -> httpx.Response | PlainResponse:
        """The request, of the controller in use, then of each other replica in turn while the one asked cannot
        answer (unreachable, or a 5xx); the last one's 5xx is returned as it is, SouthboundError when none was
        reached. Not `idempotent` (a tenant's create): only a request that never reached a controller is sent
        again."""
        start = self.urls.index(self.url) if self.url in self.urls else 0
        failure: SouthboundError | None = None
        for k in range(len(self.urls)):
            url = self.urls[(start + k) % len(self.urls)]
            if k:
                assert failure is not None
                self._move(self.urls[(start + k - 1) % len(self.urls)], url, failure)
                time.sleep(random.uniform(0, FAILOVER_JITTER_S))
            try:
                r = self.client(url, poller).request(method, path, **kw)
            except Exception as e:
                if (unreached := _unreached(e)) is None:
                    raise
                failure = SouthboundError(0, f"{method} {url}{path}: {type(e).__name__}: {e}")
                if idempotent or unreached:
                    continue
                raise failure from None
            if r.status_code >= 500 and idempotent and k < len(self.urls) - 1:  # the last one's answer is the answer
                failure = SouthboundError(r.status_code, f"{url}: {_detail(r)}")
                continue
            return r
        assert failure is not None
        raise failure

    def _move(self, left: str, to: str, why: SouthboundError) -> None:
        """`left` did not answer: use `to` from now on (said at once, before `to` answers: a long-poll there may
        take its whole timeout), unless another thread has moved us already."""
        with self._lock:
            if self.url != left:
                return
            self.url, self.failovers, self._mover = to, self.failovers + 1, threading.get_ident()
        log.warning("controller %s did not answer (%s): moving to %s", left, why, to)
        if self.on_failover is not None:
            self.on_failover(to)

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """The answer parsed as JSON (None for 304 or an empty body)."""
        r = self.send(method, path, json=body, **({"timeout": timeout} if timeout else {}))
        if r.status_code == 304:
            return None
        if r.status_code >= 400:
            raise SouthboundError(r.status_code, _detail(r))
        return r.json() if r.content else None

    def poll(self, path: str, params: Mapping[str, Any] | None = None) -> Answer:
        """One long-poll GET (200 or 304; anything else raises SouthboundError)."""
        r = self.send("GET", path, poller=True, params={**(params or {})})
        if r.status_code not in (200, 304):
            raise SouthboundError(r.status_code, _detail(r))
        return Answer(r.status_code, r.content, r.headers)

    def watch(self, path: str, model: type[M], params: Callable[[], Mapping[str, Any]],
              apply: Callable[[M, Answer], None], errors: Callable[[Exception], None] | None = None,
              stop: threading.Event | None = None) -> None:
        """Until `stop`: poll `path` with `params()` (what the caller holds: `after`, a digest) and the long-poll
        timeout; hand a 200's body, parsed as `model` straight from the bytes (a whole config at 20,000 ports is
        10 MB), to `apply`. An error goes to `errors` (else the log), then the same question again after a pause
        (0.1 s, doubling to RETRY_S while no controller answers, jittered): the caller keeps what it holds, and so
        asks from there, of whichever replica answers."""
        wait = 0.1
        while stop is None or not stop.is_set():
            try:
                got = self._poll_unless_moved(path, {**params(), "timeout": POLL_S})
                wait = 0.1
                if got is not None and got.status == 200 and got.body:
                    apply(served(model, got.body), got)
            except Exception as e:  # keep watching through controller outages and bad answers
                (errors or (lambda x: log.warning("watch %s: %s", path, x)))(e)
                time.sleep(random.uniform(wait / 2, wait))
                wait = min(RETRY_S, wait * 2)

    def stream(self, path: str, model: type[M], params: Callable[[], Mapping[str, Any]],
               apply: Callable[[M, Answer], None], errors: Callable[[Exception], None] | None = None,
               stop: threading.Event | None = None, keepalive: float = KEEPALIVE_S) -> bool:
        """`watch` on one connection (server-sent events, controller/api/host_stream.py): each event is handed to
        `apply` as it comes; when the stream breaks (the controller away, nothing heard for 3 keep-alives, another
        request moved us to another replica) the same question again from what is held, as `watch` does. False
        at once when the controller has no such stream (an older version): the caller watches instead."""
        wait = 0.1
        while stop is None or not stop.is_set():
            url = self.url
            try:
                with self.client(url, poller=True).stream(
                        "GET", path, params={**params(), "keepalive": keepalive},
                        timeout=_httpx().Timeout(self._timeout, read=3 * keepalive)) as r:
                    if r.status_code >= 400:
                        r.read()
                        if r.status_code == 404 and _detail(r) == "Not Found":
                            return False  # the route, not the host: an older controller
                        raise SouthboundError(r.status_code, _detail(r))
                    wait = 0.1
                    self.report_wanted += 1
                    self._follow(url, r, model, apply, stop)
                # the controller ended it (shutting down): a thousand hosts must not all be back in one millisecond
                time.sleep(random.uniform(0, RETRY_S))
            except Exception as e:  # keep watching through controller outages and bad answers
                if isinstance(e, _httpx().TransportError) or isinstance(e, SouthboundError) and e.status >= 500:
                    self._move_on(url, e)
                (errors or (lambda x: log.warning("stream %s: %s", path, x)))(e)
                time.sleep(random.uniform(wait / 2, wait))
                wait = min(RETRY_S, wait * 2)
            finally:
                self.streaming = False
        return True

    def _follow(self, url: str, r: httpx.Response, model: type[M], apply: Callable[[M, Answer], None],
                stop: threading.Event | None) -> None:
        """The events of one stream, until it ends, `stop`, or another request moves us off `url`."""
        event, data = "", ""
        for line in r.iter_lines():
            self.streaming, self.heard = True, time.monotonic()
            if self.url != url or stop is not None and stop.is_set():
                return
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
            elif not line and data:
                if event == "gone":
                    raise SouthboundError(404, "the controller does not know this host (deleted)")
                if event == "report":  # the controller holds us down: only our report brings us back
                    self.report_wanted += 1
                    event, data = "", ""
                    continue
                if (told := self.events.get(event)) is not None:
                    told(data)
                    event, data = "", ""
                    continue
                apply(served(model, data), Answer(200, data.encode(), r.headers))
                event, data = "", ""

    def _move_on(self, url: str, why: Exception) -> None:
        """A stream's controller failed: the next replica from now on, after the jittered pause."""
        if len(self.urls) > 1:
            nxt = self.urls[(self.urls.index(url) + 1) % len(self.urls)] if url in self.urls else self.urls[0]
            failure = why if isinstance(why, SouthboundError) else SouthboundError(0, f"{url}: {why}")
            self._move(url, nxt, failure)
            time.sleep(random.uniform(0, FAILOVER_JITTER_S))

    def _poll_unless_moved(self, path: str, params: Mapping[str, Any]) -> Answer | None:
        """One long-poll; with replicas, None as soon as another request (a beat that timed out) moved us to
        another replica: a stalled controller would hold the poll until its read timeout (40 s), and its answer,
        should one come, is dropped."""
        if len(self.urls) == 1:
            return self.poll(path, params)
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["got"] = self.poll(path, params)
            except Exception as e:
                box["error"] = e
            done.set()

        moved = self.failovers
        poller = threading.Thread(target=run, name="watch-poll", daemon=True)
        poller.start()
        while not done.wait(0.25):
            if self.failovers != moved and self._mover != poller.ident:
                return None
        if "error" in box:
            raise box["error"]
        return box["got"]

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    def register(self, name: str, vtep_ip: str, kind: str, role: str | None = None) -> None:
        self.call("POST", "/v1/hosts", {"name": name, "vtep_ip": vtep_ip, "kind": kind}
                  | ({"role": role} if role else {}))

    def beat(self, name: str, report: dict[str, Any], timeout: float | None = None) -> dict[str, Any] | None:
        """The heartbeat (with the ports' states, for a hypervisor); SouthboundError 404: the controller forgot
        us (a fresh database), register again. `timeout`, with replicas: a beat that waits longer goes to the next
        (a stalled controller must not get its hosts marked down by the others); with one controller, waiting is
        all there is to do."""
        return self.call("POST", f"/v1/hosts/{name}/status", report, timeout=timeout if len(self.urls) > 1 else None)


def served(model: type[M], body: bytes | str) -> M:
    """A watch's answer parsed as `model`, refused whole if a controller too old for this release sent it."""
    from tianji.wire import check_served  # here: the CLI's client imports this module and must not load pydantic

    msg = model.model_validate_json(body)
    check_served(msg)
    return msg


def _httpx() -> Any:
    """httpx, imported where a stream or a pooled client first needs it (a command's requests do not)."""
    # httpx's own command line (click, rich's progress bars and pygments: a third of its import) is never used
    # here; httpx falls back to a stub `main` when it cannot be imported
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    import httpx

    return httpx


def _unreached(e: Exception) -> bool | None:
    """A transport failure: True when no controller was reached (nothing sent), False when the exchange broke on
    the way; None: not a transport failure."""
    if isinstance(e, PlainHttpError):
        return e.connect
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(e, httpx.HTTPError):
        return isinstance(e, httpx.ConnectError | httpx.ConnectTimeout)
    return None


def _detail(r: httpx.Response | PlainResponse) -> str:
    try:
        return str(r.json().get("detail") or r.text[:200])
    except ValueError:
        return r.text[:200]
