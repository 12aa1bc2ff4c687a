"""The agent's series in a real Prometheus, read back by ``gpufleet-sim calibrate --prometheus``.

The real agent writes its textfile (a healthy node, then a GPU that fell off the bus in a replayed kernel-log
capture, then healthy again at the verification of its repair), Debian's prometheus-node-exporter serves it and a
real prometheus on loopback scrapes it every second. ``calibrate`` asks the server's HTTP API (``query_range``) for
the window and must find what the test did: one unhealthy episode of class xid79, ended, and one Xid 79 line in the
kernel log.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import REPO, prom_query, start_node_exporter, start_prometheus, wait_for
from test_textfile_scrape import XID79, run_agent

SCENARIO = REPO / "simulator" / "scenarios" / "default-1k.yaml"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def _unhealthy(base: str) -> str:
    got = prom_query(base, 'gpufleet_health_verdict{node="gpu-a",verdict="unhealthy"}')
    return got[0]["value"][1] if got else ""


def test_calibrate_reads_the_agents_episode_from_a_real_prometheus(tmp_path, daemons):
    textfile = tmp_path / "tf"
    since = time.time() - 1
    assert run_agent(tmp_path, "gpu-a", "", textfile)["verdict"] == "healthy"
    base = start_prometheus(daemons, tmp_path, [start_node_exporter(daemons, tmp_path, textfile)])
    wait_for(lambda: _unhealthy(base) == "0", 60, "the healthy verdict scraped")
    time.sleep(3)  # a few healthy samples: the Xid counter born later is seen to be born in the window
    assert run_agent(tmp_path, "gpu-a", XID79, textfile)["code"] == "xid79"
    wait_for(lambda: _unhealthy(base) == "1", 60, "the unhealthy verdict scraped")
    time.sleep(2)
    # the repair's verification after a reboot: the kernel events before it are what the reboot fixed
    assert run_agent(tmp_path, "gpu-a", XID79, textfile, "--repaired-at", str(time.time()))["verdict"] == "healthy"
    wait_for(lambda: _unhealthy(base) == "0", 60, "the healthy verdict scraped again")
    time.sleep(2)
    until = time.time() + 1

    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "calibrate", str(SCENARIO), "--prometheus", base,
                        "--since", _utc(since), "--until", _utc(until), "--prometheus-step", "1",
                        "--json", "-"], capture_output=True, text=True, timeout=300, check=False,
                       cwd=REPO / "simulator")
    assert r.returncode == 0, r.stdout + r.stderr
    fit = json.loads(r.stdout[r.stdout.index("{"):])
    assert fit["agent"]["episodes"] == {"xid79": 1}, (fit["agent"], r.stdout)
    assert fit["agent"]["xid_lines"] == {"79": 1.0}, fit["agent"]
    # the three checks, seen by their last-run timestamps (too few for an interval: the scenario keeps its own)
    assert fit["agent"]["detection"] == {"checks": 3, "interval_min": None, "duration_min": None}, fit["agent"]
    assert fit["groups"]["xid79"]["count"] == 1 and fit["groups"]["xid79"]["mean_out_days"] is not None
    assert not fit["unmatched"], fit["unmatched"]
    print(r.stdout[:r.stdout.index("{")])
