# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real Prometheus-side daemons on loopback for the monitoring tests: node_exporter, prometheus, alertmanager.

Each runs on a free port with a private data directory under tmp_path and is stopped by its PID. A missing
binary is a FAILURE (the Debian packages are in scripts/apt-packages.txt), never a skip.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from support.labs import start_time

REPO = Path(__file__).resolve().parents[3]
MONITORING = REPO / "monitoring"


def need(binary: str) -> str:
    path = shutil.which(binary)
    if not path:
        pytest.fail(f"{binary} not found: install the Debian packages listed in scripts/apt-packages.txt")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
        return resp.read().decode()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            value = predicate()
        except (OSError, ValueError, urllib.error.URLError) as exc:
            value, last = None, exc
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")


def _descendants(pid: int) -> list:
    """(pid, start time) of every process below ``pid`` now, from /proc (children first found, then theirs)."""
    children: dict = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append((int(p.name), fields[19]))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


def _same(pid: int, start: str) -> bool:
    return start_time(pid) == start


def stop_process(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process we started and everything it started (each by its PID, checked by its start time: an
    ansible-rulebook's playbook runs in a session of its own and outlived the rulebook), SIGKILL what does not end
    within ``grace`` seconds."""
    below = _descendants(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pid, start in below:
        if _same(pid, start):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_same(pid, start) for pid, start in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, start in below:
        if _same(pid, start):
            os.kill(pid, signal.SIGKILL)


class Daemon:
    def __init__(self, name: str, argv, log: Path, ready_url: str):
        self.name, self.log, self.ready_url = name, log, ready_url
        self.fh = open(log, "wb")  # noqa: SIM115 - kept open for the daemon's life, closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 30.0):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited rc={self.proc.returncode}: {self.log.read_text()[-2000:]}")
            return http_get(self.ready_url, timeout=2) is not None
        wait_for(ready, timeout, f"{self.name} at {self.ready_url}")
        return self

    def stop(self):
        stop_process(self.proc)
        self.fh.close()


@pytest.fixture
def daemons():
    started = []
    yield started
    for d in reversed(started):
        d.stop()


def start_node_exporter(daemons, tmp_path: Path, textfile_dir: Path, name: str = "node_exporter") -> str:
    port = free_port()
    argv = [need("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{port}",
            f"--collector.textfile.directory={textfile_dir}", "--collector.disable-defaults",
            "--collector.textfile"]
    d = Daemon(name, argv, tmp_path / f"{name}.log", f"http://127.0.0.1:{port}/metrics")
    daemons.append(d)
    d.wait_ready()
    return f"127.0.0.1:{port}"


def start_prometheus(daemons, tmp_path: Path, targets, rule_files=(), alertmanager: str | None = None,
                     interval: str = "1s") -> str:
    port = free_port()
    cfg = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
           "rule_files": [str(r) for r in rule_files],
           "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": list(targets)}]}]}
    if alertmanager:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    conf = tmp_path / "prometheus.yml"
    conf.write_text(json.dumps(cfg))  # JSON is YAML
    data = tmp_path / "prometheus-data"
    argv = [need("prometheus"), f"--config.file={conf}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}"]
    d = Daemon("prometheus", argv, tmp_path / "prometheus.log", f"http://127.0.0.1:{port}/-/ready")
    daemons.append(d)
    d.wait_ready(60)
    return f"http://127.0.0.1:{port}"


def prom_query(base: str, expr: str):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    data = json.loads(http_get(url))
    assert data["status"] == "success", data
    return data["data"]["result"]


EDA_VENV = REPO / ".cache" / "eda-venv"


def eda_bin(name: str) -> str:
    path = EDA_VENV / "bin" / name
    if not path.exists():
        pytest.fail(f"{path} missing: `make setup` builds the ansible-rulebook venv from requirements/eda.txt")
    need("java")
    return str(path)


def http_post(url: str, body: bytes, headers=None, timeout: float = 10.0):
    """(status, parsed JSON or text) of a POST; HTTP errors are answers too."""
    req = urllib.request.Request(url, data=body, method="POST", headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text
