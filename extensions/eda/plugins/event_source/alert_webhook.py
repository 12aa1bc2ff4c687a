# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.reliability.alert_webhook: an Event-Driven Ansible event source for GPU health events.

Receives, over HTTP on loopback by default:

* ``POST /alertmanager``: Alertmanager webhook notifications (payload version 4). Every *firing* alert labelled
  ``gpufleet_repair="true"`` with a ``node`` label becomes one event; other alerts are counted and dropped.
  Authenticated with ``Authorization: Bearer <token>`` (Alertmanager's ``http_config.authorization``).
* ``POST /event``: an event from the health agent or any script, ``{"node": ..., "verdict": ..., "action": ...,
  "code": ..., "gpu": ...}``; only ``verdict: unhealthy`` (or ``drain: true``) becomes an event. Authenticated with the
  bearer token, or with ``X-Gpufleet-Timestamp: <unix seconds>`` and ``X-Gpufleet-Signature: sha256=<hex>``, the
  HMAC-SHA256 of ``<timestamp>.<body>`` with ``hmac_secret`` (refused when older than ``max_skew`` seconds).

Each event put on the queue is ``{"gpufleet": {"kind": "alert"|"agent", "node", "alertname", "code", "gpu",
"action", "severity", "received_at"}}``. Anything else is refused before it reaches a rule: a wrong or missing
secret (401), a body that is not JSON or not the expected shape (400), a node name that is not a plain host name
(the alert is dropped), a body over ``max_body`` bytes (413). Floods are deduplicated: one event per node per
``dedupe_seconds`` (the rulebook adds its own throttle; the repair plan its budgets and breaker). A request with
neither a good bearer token nor a signature is refused before its body is read; a signed request is accepted once
(a replay inside the ``max_skew`` window is refused); names and codes must match whole (no trailing newline).

Every request is answered at once. A node Slurm does not know (the names ``known_nodes_command`` prints, read
again at most every ``known_nodes_ttl`` seconds) is dropped and counted as ``unknown``: it would only start runs
that find nothing to do. When the rulebook's queue has no room within ``queue_timeout`` seconds (a run is under
way and events pile up), the answer is 503 with ``Retry-After`` and the events not queued are counted as
``busy`` (and not deduplicated, so the sender's retry gets through); Alertmanager and the agent retry.

Arguments (rulebook ``sources:``):

    host: 127.0.0.1            listen address; anything but loopback needs allow_remote: true
    port: 5000
    token: ""                  shared secret; default: the environment variable named by token_env
    token_env: GPUFLEET_EDA_TOKEN
    hmac_secret: ""            default: the environment variable named by hmac_secret_env
    hmac_secret_env: GPUFLEET_EDA_HMAC_SECRET
    dedupe_seconds: 300
    max_body: 1048576
    max_skew: 300
    max_alerts: 1000           alerts read from one Alertmanager request; the rest are dropped and counted
    queue_timeout: 1           seconds to wait for room on the rulebook's queue before answering 503
    known_nodes_command: [sinfo, -h, -N, -o, "%N"]   prints the node names Slurm knows; [] accepts any name. When it
                               fails the names are not checked (logged), until the next read
    known_nodes_ttl: 60
    followup_file: ""          the repair run's <node_repair_publish_dir>/followup.json: each node in it becomes an
                               event of kind "followup" at its time (a step that needs a next step, a wait that
                               ends), without waiting for another alert; "" = none
    followup_poll: 5           seconds between two looks at followup_file
    max_connections: 256       open connections at most; a new one beyond it closes the oldest (slow clients that
                               never finish a request cannot hold the source, nor its file descriptors)
    connection_timeout: 30     seconds a connection may stay open, idle or not (a request takes milliseconds)

A follow-up is queued once per time the repair run wrote for the node (not deduplicated: it is the run asking for
the next one); a newer file replaces the schedule; a file that cannot be read or is not the expected shape is
logged and leaves the schedule as it was.

At least one of token / hmac_secret must be set: the source refuses to start without a secret.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import stat
import time
from typing import Any, Dict, List, Optional, Tuple

from aiohttp import web

LOGGER = logging.getLogger("gpufleet.reliability.alert_webhook")
# matched whole (fullmatch): with re.match and "$", "gpu17\n" passed as a node of its own
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", re.ASCII)
CODE_RE = re.compile(r"[A-Za-z0-9_.:-]{0,64}", re.ASCII)
ACTIONS = ("none", "monitor", "reset_gpu", "reboot", "reimage", "replace")


class BadRequest(ValueError):
    pass


def _clean(value: Any, pattern=CODE_RE) -> Optional[str]:
    if value is None:
        return None
    text = str(value)
    return text if pattern.fullmatch(text) else None


class Receiver:
    """Authentication, validation and deduplication; the aiohttp handlers only translate."""

    def __init__(self, queue, args: Dict[str, Any], clock=time.time):
        self.queue = queue
        self.clock = clock
        self.token = str(args.get("token") or os.environ.get(str(args.get("token_env", "GPUFLEET_EDA_TOKEN")), ""))
        self.hmac_secret = str(args.get("hmac_secret") or
                               os.environ.get(str(args.get("hmac_secret_env", "GPUFLEET_EDA_HMAC_SECRET")), ""))
        if not self.token and not self.hmac_secret:
            raise ValueError("alert_webhook: set token (or $GPUFLEET_EDA_TOKEN) or hmac_secret "
                             "(or $GPUFLEET_EDA_HMAC_SECRET); the source does not run without a secret")
        self.host = str(args.get("host", "127.0.0.1"))
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        if not loopback and not args.get("allow_remote"):
            raise ValueError(f"alert_webhook: host {self.host!r} is not loopback; set allow_remote: true to listen "
                             "there (and put TLS in front)")
        self.port = self._int(args, "port", 5000, 1, 65535)
        self.dedupe = self._int(args, "dedupe_seconds", 300, 0, 7 * 86400)
        self.max_body = self._int(args, "max_body", 1 << 20, 1024, 64 << 20)
        self.max_skew = self._int(args, "max_skew", 300, 1, 86400)
        self.queue_timeout = self._int(args, "queue_timeout", 1, 0, 60)
        self.max_alerts = self._int(args, "max_alerts", 1000, 1, 100000)
        self.seen_signatures: Dict[str, float] = {}  # replay cache: signature -> when it stops being accepted
        self.known_ttl = self._int(args, "known_nodes_ttl", 60, 1, 86400)
        cmd = args.get("known_nodes_command", ["sinfo", "-h", "-N", "-o", "%N"])
        if not isinstance(cmd, list) or not all(isinstance(a, str) and a for a in cmd):
            raise ValueError(f"alert_webhook: known_nodes_command: expected a list of arguments, got {cmd!r}")
        self.known_cmd = list(cmd)
        self._known: Optional[frozenset] = None
        self._known_at: Optional[float] = None
        self._known_lock = asyncio.Lock()
        self.last: Dict[str, float] = {}
        self.stats = {"queued": 0, "deduplicated": 0, "dropped": 0, "refused": 0, "unknown": 0, "busy": 0,
                      "followups": 0, "evicted": 0}
        ff = args.get("followup_file") or ""
        if not isinstance(ff, str):
            raise ValueError(f"alert_webhook: followup_file: expected a path, got {ff!r}")
        self.followup_file = ff
        self.followup_poll = self._int(args, "followup_poll", 5, 1, 3600)
        self.followups: Dict[str, float] = {}  # node -> when to queue its follow-up
        self.max_connections = self._int(args, "max_connections", 256, 1, 65536)
        self.connection_timeout = self._int(args, "connection_timeout", 30, 1, 3600)
        self.connections: Dict[Any, float] = {}  # transport -> when it opened (insertion order: oldest first)
        self._followup_seen: Optional[Tuple[int, int, int]] = None  # (inode, size, mtime_ns) of the file read

    @staticmethod
    def _int(args, key, default, lo, hi) -> int:
        value = args.get(key, default)
        try:
            value = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"alert_webhook: {key}: expected an integer, got {value!r}")
        if not lo <= value <= hi:
            raise ValueError(f"alert_webhook: {key}: expected {lo}..{hi}, got {value}")
        return value

    # ---- authentication ----------------------------------------------------------------------------------
    @staticmethod
    def _raw(value: str) -> bytes:
        """A header as bytes, whatever it holds (aiohttp keeps undecodable bytes as surrogates)."""
        return value.encode("utf-8", "surrogateescape")

    def bearer_ok(self, headers) -> bool:
        auth = self._raw(headers.get("Authorization", ""))
        return bool(self.token) and auth.startswith(b"Bearer ") and \
            hmac.compare_digest(auth[7:].strip(), self.token.encode())

    def may_be_signed(self, headers, allow_hmac: bool) -> bool:
        """Whether a request without a good bearer token may still be signed (read its body to check)."""
        return allow_hmac and bool(self.hmac_secret) and "X-Gpufleet-Signature" in headers

    def authenticate(self, headers, body: bytes, allow_hmac: bool) -> bool:
        if self.bearer_ok(headers):
            return True
        if not self.may_be_signed(headers, allow_hmac):
            return False
        stamp = self._raw(headers.get("X-Gpufleet-Timestamp", ""))
        sig = self._raw(headers.get("X-Gpufleet-Signature", ""))
        now = self.clock()
        try:
            age = abs(now - float(stamp.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            return False
        if not math.isfinite(age) or age > self.max_skew or not sig.startswith(b"sha256="):
            return False
        want = hmac.new(self.hmac_secret.encode(), stamp + b"." + body, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(sig[7:], want):
            return False
        # a signature is good once: a replay inside the window (after a dedupe expiry, from a skewed signer) is
        # refused; kept as long as its timestamp is accepted, and bounded
        if len(self.seen_signatures) > 100000:
            self.seen_signatures = {k: t for k, t in self.seen_signatures.items() if t > now}
        key = want.decode()
        if key in self.seen_signatures and self.seen_signatures[key] > now:
            LOGGER.warning("alert_webhook: refused a replayed signed request")
            return False
        if len(self.seen_signatures) > 100000:  # still full of live signatures: refuse rather than forget one
            return False
        self.seen_signatures[key] = now + 2 * self.max_skew
        return True

    # ---- payloads ------------------------------------------------------------------------------------------
    @staticmethod
    def _json(body: bytes) -> Dict[str, Any]:
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise BadRequest("body is not JSON (or nested too deep)")
        if not isinstance(data, dict):
            raise BadRequest("expected a JSON object")
        return data

    def from_alertmanager(self, body: bytes) -> Tuple[List[Dict[str, Any]], int]:
        data = self._json(body)
        alerts = data.get("alerts")
        if not isinstance(alerts, list) or not isinstance(data.get("version", "4"), str):
            raise BadRequest("not an Alertmanager webhook payload: 'alerts' must be a list")
        events, dropped = [], max(0, len(alerts) - self.max_alerts)
        for a in alerts[: self.max_alerts]:
            labels = a.get("labels") if isinstance(a, dict) else None
            if not isinstance(labels, dict) or a.get("status") != "firing" or \
                    labels.get("gpufleet_repair") != "true":
                dropped += 1
                continue
            node = _clean(labels.get("node"), NODE_RE)
            if node is None:
                dropped += 1
                continue
            events.append({"kind": "alert", "node": node, "alertname": _clean(labels.get("alertname")),
                           "code": _clean(labels.get("code")), "gpu": _clean(labels.get("gpu")),
                           "action": _clean(labels.get("action")), "severity": _clean(labels.get("severity"))})
        return events, dropped

    def from_agent(self, body: bytes) -> Tuple[List[Dict[str, Any]], int]:
        data = self._json(body)
        node = _clean(data.get("node"), NODE_RE)
        if node is None:
            raise BadRequest("node: expected a host name (letters, digits, '.', '_', '-')")
        action = data.get("action", "none")
        if action not in ACTIONS:
            raise BadRequest(f"action: expected one of {', '.join(ACTIONS)}")
        if data.get("verdict") != "unhealthy" and data.get("drain") is not True:
            return [], 1
        return [{"kind": "agent", "node": node, "alertname": None, "code": _clean(data.get("code")),
                 "gpu": _clean(data.get("gpu")), "action": action, "severity": None}], 0

    async def known_nodes(self) -> Optional[frozenset]:
        """The node names Slurm knows, read at most every ``known_nodes_ttl`` seconds; None: do not check (no
        command, or it failed: logged, and not run again before the ttl)."""
        if not self.known_cmd:
            return None
        async with self._known_lock:
            now = self.clock()
            if self._known_at is not None and now - self._known_at < self.known_ttl:
                return self._known
            self._known_at, self._known = now, None
            proc = None
            try:
                proc = await asyncio.create_subprocess_exec(*self.known_cmd, stdin=asyncio.subprocess.DEVNULL,
                                                            stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.PIPE)
                out, err = await asyncio.wait_for(proc.communicate(), timeout=10)
            except (OSError, asyncio.TimeoutError) as exc:
                if proc is not None and proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                LOGGER.warning("alert_webhook: known_nodes_command %s failed (%s); node names are not checked",
                               self.known_cmd, type(exc).__name__)
                return None
            if proc.returncode != 0:
                LOGGER.warning("alert_webhook: known_nodes_command %s exited %s: %s; node names are not checked",
                               self.known_cmd, proc.returncode, err[:200].decode("utf-8", "replace").strip())
                return None
            names = out[:16 << 20].decode("utf-8", "replace").split()
            self._known = frozenset(n for n in names if NODE_RE.fullmatch(n))
            return self._known

    async def put(self, events: List[Dict[str, Any]]) -> Dict[str, int]:
        """Queue the events (one per node per dedupe period); never waits more than ``queue_timeout`` for room."""
        now = self.clock()
        counts = {"queued": 0, "deduplicated": 0, "unknown": 0, "busy": 0}
        known = await self.known_nodes() if events else None
        for ev in events:
            if known is not None and ev["node"] not in known:
                counts["unknown"] += 1
                continue
            last = self.last.get(ev["node"])
            if last is not None and now - last < self.dedupe:
                counts["deduplicated"] += 1
                continue
            if counts["busy"]:  # the queue had no room a moment ago: the rest are not tried
                counts["busy"] += 1
                continue
            ev["received_at"] = now
            try:
                await asyncio.wait_for(self.queue.put({"gpufleet": ev}), timeout=self.queue_timeout or 0.001)
            except asyncio.TimeoutError:
                counts["busy"] += 1
                continue
            self.last[ev["node"]] = now
            counts["queued"] += 1
        for k, v in counts.items():
            self.stats[k] += v
        if len(self.last) > 100000:  # bound the memory a flood of distinct names could take
            cutoff = now - self.dedupe
            self.last = {n: t for n, t in self.last.items() if t >= cutoff}
        return counts

    # ---- follow-ups the repair run asks for ------------------------------------------------------------------
    def read_followups(self) -> None:
        """Take the schedule from ``followup_file`` when it changed (a file under 1 MiB, not a link:
        ``{"nodes": {node: epoch seconds}}``)."""
        try:
            fd = os.open(self.followup_file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return
        except OSError as exc:
            LOGGER.warning("alert_webhook: followup_file %s: %s", self.followup_file, exc.strerror or exc)
            return
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            if seen == self._followup_seen:
                return
            self._followup_seen = seen
            if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
                LOGGER.warning("alert_webhook: followup_file %s: not a regular file under 1 MiB; ignored",
                               self.followup_file)
                return
            raw = fh.read(1 << 20)
        try:
            nodes = self._json(raw).get("nodes")
        except BadRequest:
            nodes = None
        if not isinstance(nodes, dict):
            LOGGER.warning("alert_webhook: followup_file %s: expected {\"nodes\": {node: time}}; ignored",
                           self.followup_file)
            return
        schedule = {}
        for node, at in list(nodes.items())[: self.max_alerts]:
            if isinstance(node, str) and NODE_RE.fullmatch(node) and isinstance(at, (int, float)) and \
                    not isinstance(at, bool) and math.isfinite(at):
                schedule[node] = float(at)
        self.followups = schedule

    async def put_followups(self) -> int:
        """Queue the follow-ups that are due (not deduplicated); one the queue has no room for stays scheduled."""
        now = self.clock()
        due = [n for n, at in self.followups.items() if at <= now]
        if not due:
            return 0
        known = await self.known_nodes()
        queued = 0
        for node in due:
            if known is not None and node not in known:
                self.followups.pop(node, None)
                self.stats["unknown"] += 1
                continue
            ev = {"kind": "followup", "node": node, "alertname": None, "code": None, "gpu": None, "action": None,
                  "severity": None, "received_at": now}
            try:
                await asyncio.wait_for(self.queue.put({"gpufleet": ev}), timeout=self.queue_timeout or 0.001)
            except asyncio.TimeoutError:
                break  # the queue is full: the rest stay scheduled for the next look
            self.followups.pop(node, None)
            self.last[node] = now
            queued += 1
        self.stats["followups"] += queued
        return queued

    async def followup_loop(self) -> None:
        while True:
            self.read_followups()
            await self.put_followups()
            await asyncio.sleep(self.followup_poll)

    async def handle(self, request: web.Request, kind: str) -> web.Response:
        allow_hmac = kind == "agent"
        # no good bearer token and no signature: refused before the body is read (slow bodies cost nothing)
        if not self.bearer_ok(request.headers) and not self.may_be_signed(request.headers, allow_hmac):
            body = b""
        else:
            body = await request.read()
        if not self.authenticate(request.headers, body, allow_hmac=allow_hmac):
            self.stats["refused"] += 1
            LOGGER.warning("alert_webhook: refused a request to /%s from %s: bad or missing secret",
                           "event" if kind == "agent" else "alertmanager", request.remote)
            return web.json_response({"error": "unauthorized"}, status=401)
        try:
            events, dropped = self.from_agent(body) if kind == "agent" else self.from_alertmanager(body)
        except BadRequest as exc:
            self.stats["refused"] += 1
            return web.json_response({"error": str(exc)}, status=400)
        self.stats["dropped"] += dropped
        counts = await self.put(events)
        counts["dropped"] = dropped
        if counts["busy"]:
            LOGGER.warning("alert_webhook: the rulebook's queue is full: %d event(s) not queued (503)", counts["busy"])
            return web.json_response(counts, status=503, headers={"Retry-After": "30"})
        return web.json_response(counts, status=202)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)

        async def alertmanager(request):
            return await self.handle(request, "alert")

        async def agent(request):
            return await self.handle(request, "agent")

        app.router.add_post("/alertmanager", alertmanager)
        app.router.add_post("/event", agent)
        return app


class _OncePerMinute(logging.Filter):
    """Lets a repeated asyncio log record through once a minute (a file-descriptor shortage makes asyncio log
    "socket.accept() out of system resource" for every accept it retries: hundreds of MB a minute)."""

    def __init__(self, clock=time.monotonic):
        super().__init__()
        self.clock, self.last, self.quiet = clock, {}, 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg if isinstance(record.msg, str) else repr(record.msg))
        now = self.clock()
        if now - self.last.get(key, -math.inf) < 60:
            self.quiet += 1
            return False
        if len(self.last) > 1000:
            self.last.clear()
        self.last[key] = now
        return True


class _Guard(asyncio.Protocol):
    """aiohttp's request handler behind a connection cap and a lifetime: the connection is closed after
    ``connection_timeout`` seconds, and one beyond ``max_connections`` closes the oldest open one."""

    def __init__(self, receiver: Receiver, inner: Any):
        self.receiver, self.inner, self.transport, self.timer = receiver, inner, None, None

    def connection_made(self, transport):
        conns, loop = self.receiver.connections, asyncio.get_running_loop()
        while len(conns) >= self.receiver.max_connections:
            oldest = next(iter(conns))
            conns.pop(oldest, None)
            self.receiver.stats["evicted"] += 1
            oldest.abort()
        self.transport = transport
        conns[transport] = loop.time()
        self.timer = loop.call_later(self.receiver.connection_timeout, transport.abort)
        self.inner.connection_made(transport)

    def connection_lost(self, exc):
        self.receiver.connections.pop(self.transport, None)
        if self.timer is not None:
            self.timer.cancel()
        self.inner.connection_lost(exc)

    def data_received(self, data):
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self):
        self.inner.pause_writing()

    def resume_writing(self):
        self.inner.resume_writing()


async def main(queue, args: Dict[str, Any]):
    receiver = Receiver(queue, args or {})
    logging.getLogger("asyncio").addFilter(_OncePerMinute())
    runner = web.AppRunner(receiver.app(), max_field_size=8190, max_line_size=8190)
    await runner.setup()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Guard(receiver, runner.server()), receiver.host, receiver.port,
                                      reuse_address=True, backlog=128)
    LOGGER.info("alert_webhook: listening on %s:%s", receiver.host, receiver.port)
    follow = asyncio.ensure_future(receiver.followup_loop()) if receiver.followup_file else None
    try:
        await asyncio.Future()
    finally:
        if follow is not None:
            follow.cancel()
        server.close()
        await runner.cleanup()


if __name__ == "__main__":  # pragma: no cover - by hand: print the events it would queue

    class _PrintQueue:
        async def put(self, event):
            LOGGER.warning("%s", json.dumps(event))

    logging.basicConfig(level=logging.INFO)
    asyncio.run(main(_PrintQueue(), {"port": int(os.environ.get("PORT", "5000"))}))
