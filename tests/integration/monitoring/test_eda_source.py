"""The collection's Event-Driven Ansible source gpufleet.reliability.alert_webhook, run for real (aiohttp in the
ansible-rulebook venv) and attacked over HTTP: forged, stale, malformed, oversized and hostile requests are refused
before any event reaches a rule; genuine Alertmanager and agent requests are the controls; floods are deduplicated
to one event per node."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, eda_bin, free_port, http_post, stop_process, wait_for

HARNESS = Path(__file__).resolve().parent / "eda_source_harness.py"
TOKEN, SECRET = "tok-3f9a", "hmac-51c2"


class Source:
    def __init__(self, args):
        self.proc = subprocess.Popen([eda_bin("python"), str(HARNESS), json.dumps(args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.events = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def stop(self):
        stop_process(self.proc)


# the nodes "Slurm knows" for the source (known_nodes_command)
KNOWN = ["sh", "-c", "printf 'gpu1\\ngpu2\\ngpu3 gpu4\\n'"]


def start_source(**more):
    port = free_port()
    s = Source({"port": port, "token": TOKEN, "hmac_secret": SECRET, "dedupe_seconds": 300, "max_body": 4096,
                "known_nodes_command": KNOWN, **more})
    s.url = f"http://127.0.0.1:{port}"
    s.port = port

    def up():
        if s.proc.poll() is not None:
            raise AssertionError(s.proc.stderr.read())
        return http_post(s.url + "/alertmanager", b"{}")[0] == 401
    wait_for(up, 60, "the event source to listen")
    return s


@pytest.fixture
def source():
    s = start_source()
    yield s
    s.stop()


def alert(node, status="firing", **labels):
    lab = {"alertname": "GpufleetGpuLost", "node": node, "gpu": "3", "gpufleet_repair": "true", "severity": "page"}
    lab.update(labels)
    return {"status": status, "labels": lab, "annotations": {}, "startsAt": "2026-12-04T10:00:00Z"}


def am_body(*alerts):
    return json.dumps({"version": "4", "status": "firing", "receiver": "gpufleet-rulebook",
                       "groupLabels": {}, "alerts": list(alerts)}).encode()


BEARER = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def signed(body: bytes, secret=SECRET, stamp=None):
    stamp = str(int(time.time()) if stamp is None else stamp)
    sig = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"X-Gpufleet-Timestamp": stamp, "X-Gpufleet-Signature": f"sha256={sig}"}


def test_refused_requests_queue_nothing(source):
    good = am_body(alert("gpu1"))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}, signed(good)):  # HMAC is for /event only
        assert http_post(source.url + "/alertmanager", good, headers)[0] == 401, headers
    agent = json.dumps({"node": "gpu1", "verdict": "unhealthy", "action": "reboot", "code": "xid79"}).encode()
    for headers in (signed(agent, secret="other"), signed(agent, stamp=time.time() - 3600),
                    signed(agent, stamp="nan"), signed(agent, stamp="inf"), signed(agent + b" ")):
        assert http_post(source.url + "/event", agent, headers)[0] == 401, headers
    # tampered body under a signature made for the original
    h = signed(agent)
    assert http_post(source.url + "/event", agent.replace(b"gpu1", b"gpu2"), h)[0] == 401
    assert http_post(source.url + "/alertmanager", b"not json", BEARER)[0] == 400
    assert http_post(source.url + "/alertmanager", b"[1, 2]", BEARER)[0] == 400
    assert http_post(source.url + "/alertmanager", b'{"alerts": "x"}', BEARER)[0] == 400
    assert http_post(source.url + "/alertmanager", b"\xff\xfe", BEARER)[0] == 400
    assert http_post(source.url + "/event", b'{"node": "gpu1; rm -rf /", "verdict": "unhealthy"}', BEARER)[0] == 400
    assert http_post(source.url + "/event", b'{"node": "gpu1", "verdict": "unhealthy", "action": "nuke"}',
                     BEARER)[0] == 400
    assert http_post(source.url + "/alertmanager", am_body(alert("gpu1")) + b" " * 5000, BEARER)[0] == 413
    assert http_post(source.url + "/nope", good, BEARER)[0] == 404
    # hostile or foreign alerts are dropped, the request itself is fine
    status, answer = http_post(source.url + "/alertmanager", am_body(
        alert("-gpu1"), alert("gpu1\nx"), alert("a" * 80), alert("gpu1", status="resolved"),
        alert("gpu1", gpufleet_repair="false"), {"labels": "x"}, "junk"), BEARER)
    assert (status, answer) == (202, {"queued": 0, "deduplicated": 0, "dropped": 7, "unknown": 0, "busy": 0})
    healthy = json.dumps({"node": "gpu1", "verdict": "healthy", "action": "none"}).encode()
    assert http_post(source.url + "/event", healthy, signed(healthy))[1]["dropped"] == 1
    time.sleep(0.5)  # nothing may arrive late
    assert source.events == []


def test_genuine_requests_queue_one_event_per_node(source):
    status, answer = http_post(source.url + "/alertmanager", am_body(alert("gpu1"), alert("gpu2", code="xid48")),
                               BEARER)
    assert (status, answer) == (202, {"queued": 2, "deduplicated": 0, "dropped": 0, "unknown": 0, "busy": 0})
    # a flood: Alertmanager repeats, the agent reports the same node again - all deduplicated
    for _i in range(20):
        assert http_post(source.url + "/alertmanager", am_body(alert("gpu1")), BEARER)[1]["deduplicated"] == 1
    agent = json.dumps({"node": "gpu3", "verdict": "unhealthy", "action": "reset_gpu", "code": "xid48",
                        "gpu": 2}).encode()
    assert http_post(source.url + "/event", agent, signed(agent))[1]["queued"] == 1
    # the agent's next report of the same node (signed anew): deduplicated
    assert http_post(source.url + "/event", agent, signed(agent, stamp=int(time.time()) - 1))[1]["deduplicated"] == 1
    drain = json.dumps({"node": "gpu4", "verdict": "degraded", "drain": True, "code": "node_power_brake"}).encode()
    assert http_post(source.url + "/event", drain, BEARER)[1]["queued"] == 1
    wait_for(lambda: len(source.events) == 4, 10, "four events")
    time.sleep(0.3)
    got = [e["gpufleet"] for e in source.events]
    assert [(e["kind"], e["node"]) for e in got] == [("alert", "gpu1"), ("alert", "gpu2"), ("agent", "gpu3"),
                                                     ("agent", "gpu4")]
    assert got[0]["alertname"] == "GpufleetGpuLost" and got[0]["gpu"] == "3" and got[1]["code"] == "xid48"
    assert got[2]["action"] == "reset_gpu" and got[2]["gpu"] == "2" and isinstance(got[2]["received_at"], float)


def test_hostile_requests_as_an_attacker_sends_them(source):
    """Issue 26 section 4: each of these got a 500, was counted as a node of its own, or was accepted twice."""
    agent = json.dumps({"node": "gpu1", "verdict": "unhealthy", "action": "reboot", "code": "xid79"}).encode()
    # a replay of a good signed request inside the window
    h = signed(agent)
    assert http_post(source.url + "/event", agent, h)[1]["queued"] == 1
    assert http_post(source.url + "/event", agent, h)[0] == 401
    # a newline after a node name: not a node of its own
    nl = json.dumps({"node": "gpu1\n", "verdict": "unhealthy", "action": "reboot"}).encode()
    assert http_post(source.url + "/event", nl, BEARER)[0] == 400
    status, answer = http_post(source.url + "/alertmanager", am_body(alert("gpu2\n"), alert("gpu2", code="xid79\n")),
                               BEARER)
    # the alert for "gpu2\n" is dropped; the other keeps its node and loses the hostile code
    assert status == 202 and answer["dropped"] == 1 and answer["queued"] == 1, answer
    # bytes that are not UTF-8 in the Authorization header: 401, not a 500
    assert raw_post(source.port, b"/alertmanager", b"Authorization: Bearer \xff\xfe\r\n", b"{}")[0] == 401
    # JSON nested 100,000 deep: 400, not a RecursionError
    assert http_post(source.url + "/event", b"[" * 100000 + b"]" * 100000, BEARER)[0] in (400, 413)
    wait_for(lambda: len(source.events) == 2, 10, "two events")
    time.sleep(0.3)
    got = [e["gpufleet"] for e in source.events]
    assert [e["node"] for e in got] == ["gpu1", "gpu2"] and got[1]["code"] is None, got


def test_an_unauthenticated_body_is_never_waited_for(source):
    """A request with no secret is refused before its body is read: a slow or huge body costs nothing."""
    t0 = time.monotonic()
    status, _text = raw_post(source.port, b"/alertmanager", b"Content-Length: 1000000\r\n", b"{")
    assert status == 401 and time.monotonic() - t0 < 5


def test_alerts_past_the_cap_are_dropped_and_counted():
    source = start_source(max_alerts=2, max_body=65536)
    try:
        status, answer = http_post(source.url + "/alertmanager",
                                   am_body(alert("gpu1"), alert("gpu2"), alert("gpu3"), alert("gpu4")), BEARER)
        assert (status, answer["queued"], answer["dropped"]) == (202, 2, 2), answer
    finally:
        source.stop()


def raw_post(port, path, extra_headers, body):
    """(status, text) of a POST written by hand: headers urllib would refuse to send, a body that never comes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + extra_headers + (b"" if b"Content-Length" in extra_headers else
                                        b"Content-Length: %d\r\n" % len(body)) + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\r\n", 1)[0].split()
    return int(line[1]), data.decode("latin-1")


def test_names_slurm_does_not_know_are_dropped_and_counted():
    """Issue: one post with 24 names Slurm does not know started 24 fleet-wide repair runs."""
    source = start_source(max_body=65536)
    try:
        names = [f"ghost{i}" for i in range(24)]
        status, answer = http_post(source.url + "/alertmanager",
                                   am_body(*[alert(n) for n in names], alert("gpu1")), BEARER)
        assert (status, answer) == (202, {"queued": 1, "deduplicated": 0, "dropped": 0, "unknown": 24, "busy": 0})
        ghost = json.dumps({"node": "ghost1", "verdict": "unhealthy", "action": "reboot"}).encode()
        assert http_post(source.url + "/event", ghost, signed(ghost))[1]["unknown"] == 1
        wait_for(lambda: len(source.events) == 1, 10, "one event")
        time.sleep(0.3)
    finally:
        source.stop()
    assert [e["gpufleet"]["node"] for e in source.events] == ["gpu1"]


def test_a_failing_node_list_checks_no_names():
    s = start_source(known_nodes_command=["sh", "-c", "echo slurmctld down >&2; exit 1"])
    try:
        status, answer = http_post(s.url + "/alertmanager", am_body(alert("newnode7")), BEARER)
        assert (status, answer["queued"], answer["unknown"]) == (202, 1, 0)
    finally:
        s.stop()
    err = s.proc.stderr.read()
    assert "known_nodes_command" in err and "exited 1: slurmctld down" in err, err


def test_a_full_queue_is_answered_at_once_with_503():
    """Issue: during a run the queue was full and a post was answered after 152.9 s; now at once, and the sender
    retries."""
    s = start_source(_stall_after=1, queue_timeout=1)
    try:
        assert http_post(s.url + "/alertmanager", am_body(alert("gpu1")), BEARER)[1]["queued"] == 1
        t0 = time.monotonic()
        status, answer = http_post(s.url + "/alertmanager", am_body(alert("gpu2"), alert("gpu3")), BEARER)
        took = time.monotonic() - t0
        assert (status, answer) == (503, {"queued": 0, "deduplicated": 0, "dropped": 0, "unknown": 0, "busy": 2})
        assert took < 10, took  # queue_timeout 1 s, not the length of a repair run
        # not deduplicated: the sender's retry is tried again (and is busy again while the queue is full)
        assert http_post(s.url + "/alertmanager", am_body(alert("gpu2")), BEARER)[:1] == (503,)
    finally:
        s.stop()
    assert [e["gpufleet"]["node"] for e in s.events] == ["gpu1"]


@pytest.mark.parametrize("args,message", [
    ({}, "does not run without a secret"),
    ({"token": "x", "host": "0.0.0.0"}, "not loopback"),
    ({"token": "x", "port": "http"}, "port: expected an integer"),
    ({"token": "x", "dedupe_seconds": -1}, "dedupe_seconds: expected"),
])
def test_unsafe_settings_refuse_to_start(args, message):
    p = subprocess.run([eda_bin("python"), str(HARNESS), json.dumps(args)], capture_output=True, text=True,
                       timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and message in p.stderr, p.stderr


VALIDATE = """
import sys, yaml
from ansible_rulebook.validators import Validate
from ansible_rulebook.rules_parser import parse_rule_sets
for path in sys.argv[1:]:
    data = yaml.safe_load(open(path))
    Validate.rulebook(data)
    sets = parse_rule_sets(data)
    print(path, [r.name for s in sets for r in s.rules])
"""


def test_shipped_rulebooks_pass_ansible_rulebooks_own_schema_and_parser(tmp_path):
    books = sorted((REPO / "extensions" / "eda" / "rulebooks").glob("*.yml"))
    assert [b.name for b in books] == ["repair.yml", "repair_awx.yml"]
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
               PATH=str(Path(eda_bin("ansible-galaxy")).parent) + ":" + os.environ.get("PATH", ""))
    p = subprocess.run([eda_bin("python"), "-c", VALIDATE, *map(str, books)], capture_output=True, text=True,
                       timeout=120, check=False, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "['Repair the node', 'Follow up on a repair']" in p.stdout
    assert "['Launch the repair job template']" in p.stdout
    broken = tmp_path / "broken.yml"
    broken.write_text(books[0].read_text().replace("run_playbook:", "run_playbok:"))
    p = subprocess.run([eda_bin("python"), "-c", VALIDATE, str(broken)], capture_output=True, text=True,
                       timeout=120, check=False, env=env)
    assert p.returncode != 0


def _write(path, data):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data if isinstance(data, str) else json.dumps(data))
    os.replace(tmp, path)  # as repair_publish writes it


def test_followups_of_the_repair_run_are_queued_at_their_time_once(tmp_path):
    """Issue 27 case 11: the repair run writes followup.json; the source queues each node at its time without a
    new alert and without the dedupe (an alert for gpu1 was just queued), and only once per time written."""
    ff = tmp_path / "followup.json"
    s = start_source(followup_file=str(ff), followup_poll=1)
    try:
        assert http_post(s.url + "/alertmanager", am_body(alert("gpu1")), BEARER)[0] == 202
        wait_for(lambda: len(s.events) == 1, 10, "the alert's event")
        now = time.time()
        _write(ff, {"nodes": {"gpu1": now - 1, "gpu2": now + 4, "ghost": now - 1}})
        wait_for(lambda: len(s.events) == 2, 10, "gpu1's follow-up")
        assert s.events[1]["gpufleet"]["kind"] == "followup" and s.events[1]["gpufleet"]["node"] == "gpu1"
        wait_for(lambda: len(s.events) == 3, 15, "gpu2's follow-up at its time")
        assert s.events[2]["gpufleet"]["node"] == "gpu2" and s.events[2]["gpufleet"]["received_at"] >= now + 4
        time.sleep(2.5)
        assert len(s.events) == 3  # each once; "ghost" is not a node Slurm knows
        # hostile or broken files change nothing and stop nothing: a link, junk, a wrong shape, bad names/times
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps({"nodes": {"gpu3": 0}}))
        ff.unlink()
        ff.symlink_to(target)
        time.sleep(2.5)
        for junk in ("{not json", json.dumps([1]), json.dumps({"nodes": []}),
                     json.dumps({"nodes": {"gpu3\n": 0, "gpu3 x": 0, "gpu4": "soon", "gpu1": True}}),
                     '{"nodes": {"gpu4": Infinity}}', "[" * 100000):
            ff.unlink()
            _write(ff, junk)
            time.sleep(1.5)
        assert len(s.events) == 3, s.events[3:]
        _write(ff, {"nodes": {"gpu3": 0}})  # a genuine file after all that: the control
        wait_for(lambda: len(s.events) == 4, 10, "gpu3's follow-up")
        assert s.events[3]["gpufleet"]["node"] == "gpu3" and s.proc.poll() is None
    finally:
        s.stop()


def _half_requests(port, n):
    """n connections that each send half a request line and then nothing (slowloris)."""
    socks = []
    for _unused in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /alertmanager HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    return socks


def _closed_by_peer(s) -> bool:
    s.settimeout(0.2)
    try:
        return s.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def test_slow_clients_cannot_hold_the_source():
    """Issue 26 section 4: 1,100 half-sent requests starved the source for over a minute and made asyncio log
    "socket.accept() out of system resource" without end. With a cap of 64 connections and a 3-second lifetime, 300
    of them hold nothing: a genuine alert is answered at once while they are open, and each one is closed."""
    s = start_source(max_connections=64, connection_timeout=3)
    socks = []
    try:
        socks = _half_requests(s.port, 300)
        t0 = time.monotonic()
        status, _text = http_post(s.url + "/alertmanager", am_body(alert("gpu1")), BEARER)
        assert status == 202 and time.monotonic() - t0 < 5, status  # the control gets through at once
        wait_for(lambda: len(s.events) == 1, 10, "the genuine alert's event")
        deadline = time.monotonic() + 20
        open_ = list(socks)
        while open_ and time.monotonic() < deadline:
            open_ = [x for x in open_ if not _closed_by_peer(x)]
        assert not open_, f"{len(open_)} slow connections still open"
        assert s.proc.poll() is None
    finally:
        for x in socks:
            x.close()
        s.stop()
    assert "out of system resource" not in s.proc.stderr.read()


@pytest.mark.parametrize("args,message", [({"max_connections": 0}, "max_connections: expected 1..65536"),
                                          ({"connection_timeout": "x"}, "connection_timeout: expected an integer")])
def test_connection_limits_are_checked(args, message):
    p = subprocess.run([eda_bin("python"), str(HARNESS), json.dumps({"port": free_port(), "token": TOKEN, **args})],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2 and message in p.stderr, p.stderr
