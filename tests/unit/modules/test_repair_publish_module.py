# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""repair_publish run for real through Ansible: a run's results, summary and metrics in one module run."""
import json
import os
import socket
import stat
import subprocess
import sys

from ansible_collections.gpufleet.reliability.plugins.module_utils.runlock import acquire, proc_stat
from support.ansible_cli import run_module

PLAN = {"decisions": [{"node": "node2", "action": "hold", "rule": "breaker", "runnable": False},
                      {"node": "node4", "action": "wait", "rule": "ttl", "earliest": 1700000300.0,
                       "needs_approval": False, "runnable": False}],
        "counts": {"hold": 1, "wait": 1}}
BREAKER = {"tripped": True, "since": 1.0, "reason": "4 nodes failed", "reset_at": None, "nodes": ["node2"]}
RESULTS = [{"node": "node3", "action": "reset_gpu", "failed": False, "verified": "healthy", "resumed": True},
           {"node": "node5", "action": "reset_gpu", "failed": False, "verified": "unhealthy", "resumed": False}]
FOLLOWUP = {"node4": 1700000300, "node5": 1700000060}  # the TTL's end; the next step of a reset that did not help
SUMMARY = {"headline": "repair run: 1 repaired", "lines": ["node3: repaired"], "problems": []}


def publish(tmp_path, check=False, **more):
    args = {"publish_dir": str(tmp_path / "pub"), "textfile_dir": str(tmp_path / "prom"), "results": RESULTS,
            "summary": SUMMARY, "plan": PLAN, "breaker": BREAKER, "now": 1700000000.0, **more}
    return run_module("repair_publish", args, check=check)


def test_writes_every_file_once_then_changes_nothing(tmp_path):
    (tmp_path / "pub").mkdir()
    (tmp_path / "prom").mkdir()
    files = [str(tmp_path / "pub" / "result.json"), str(tmp_path / "pub" / "summary.json"),
             str(tmp_path / "pub" / "followup.json"), str(tmp_path / "prom" / "gpufleet_repair.prom")]

    ok, res = publish(tmp_path, check=True)
    assert ok and res["changed"] is True and res["written"] == files, res
    assert not os.listdir(tmp_path / "pub") and not os.listdir(tmp_path / "prom"), "check mode wrote"

    ok, res = publish(tmp_path)
    assert ok and res["changed"] is True and res["written"] == files and res["lock_freed"] is False, res
    assert json.loads((tmp_path / "pub" / "result.json").read_text()) == RESULTS
    assert json.loads((tmp_path / "pub" / "summary.json").read_text()) == SUMMARY
    assert json.loads((tmp_path / "pub" / "followup.json").read_text()) == {"nodes": FOLLOWUP}
    assert res["followup"] == FOLLOWUP
    prom = (tmp_path / "prom" / "gpufleet_repair.prom").read_text()
    assert "gpufleet_repair_breaker_open 1" in prom and 'gpufleet_repair_decisions{action="hold"} 1' in prom
    assert "\ngpufleet_repair_last_run_timestamp_seconds 1700000000.0\n" in prom, prom
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o644 for f in files)
    assert not [p for p in os.listdir(tmp_path / "pub") if p.startswith(".")], "a temporary file was left"

    ok, res = publish(tmp_path)
    assert ok and res["changed"] is False and res["written"] == [], res  # run twice: nothing to do

    ok, res = publish(tmp_path, results=[])
    assert ok and res["written"] == [files[0], files[2], files[3]], res  # only what differs
    assert res["followup"] == {"node4": 1700000300}


def test_bad_input_names_the_field_and_writes_nothing(tmp_path):
    (tmp_path / "prom").mkdir()
    ok, res = publish(tmp_path)  # publish_dir does not exist
    assert not ok and "publish_dir: expected an existing directory" in res["msg"], res
    assert os.listdir(tmp_path / "prom") == []
    (tmp_path / "pub").mkdir()
    ok, res = publish(tmp_path, mode="rw-r--r--")
    assert not ok and "mode: expected an octal mode" in res["msg"], res
    assert os.listdir(tmp_path / "pub") == []


def test_a_lock_another_run_holds_is_left_alone(tmp_path):
    (tmp_path / "pub").mkdir()
    (tmp_path / "prom").mkdir()
    lock = str(tmp_path / "repair.lock")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        held = acquire(lock, me=(other.pid, proc_stat(other.pid)[1]))
        assert held["host"] == socket.gethostname()
        ok, res = publish(tmp_path, lock_file=lock)
        assert ok and res["lock_freed"] is False, res
        assert json.loads((tmp_path / "repair.lock").read_text()) == held
    finally:
        other.kill()
        other.wait()
